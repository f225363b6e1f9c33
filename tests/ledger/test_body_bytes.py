"""Event bodies as arrays of field values: no field names in a record, every fact kept, and the
map bodies of ledgers written before still read, verify, replay and audit as they did."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from ledger import events as ev
from ledger import open_store
from ledger.codec import decode_body, encode_body, encode_map_body
from runtime.audit import Provenance
from runtime.audit.index import query_events
from runtime.controller import replay
from tests.runtime.controller.golden.regenerate import HERE, RUNS


def _demo_completion_and_outcome() -> tuple[ev.RolloutCompleted, ev.OutcomeRecorded]:
    """A rollout of the built-in demo as its ledger records it (5 tokens, the math verifier)."""
    tokens = np.array([5, 5, 9, 7, 1], np.int32)
    logprobs = np.array([-0.08, -0.12, -1.5, -0.01, -0.3], np.float32)
    return (ev.RolloutCompleted(1000, "inference-0.1", 0, 2, "fb5d901e" * 8, tokens, logprobs, "stop"),
            ev.OutcomeRecorded(1000, 0.0, False, "WA", "math", "math/2+math-verify/0.9.0",
                               "answer '1197' (formula) vs reference '1098': not equal (exact)"))


@pytest.mark.parametrize("which", [0, 1])
def test_a_body_holds_the_values_and_not_the_names(which):
    e = _demo_completion_and_outcome()[which]
    body, old = encode_body(e), encode_map_body(e)
    names = sorted(e.FIELDS)
    assert not any(name.encode() in body for name in names)
    # The map form costs exactly the packed names more (both headers are one byte here).
    assert len(old) - len(body) == sum(len(msgpack.packb(name)) for name in names)
    assert decode_body(e.KIND, e.VERSION, body) == decode_body(e.KIND, e.VERSION, old) == e
    assert msgpack.unpackb(body, raw=False, ext_hook=lambda code, data: data)[names.index("rollout_id")] == 1000


def _golden(name: str) -> list[tuple[str, int, bytes]]:
    return [tuple(r) for r in msgpack.unpackb((HERE / f"{name}.msgpack").read_bytes(), raw=False)]


@pytest.mark.parametrize("name", [*RUNS, "v1_deterministic_k1"])
def test_a_ledger_of_map_bodies_reads_verifies_replays_and_audits_as_before(name, tmp_path):
    records = _golden(name)  # bodies as older software wrote them: maps of fields by name
    maps = [type(msgpack.unpackb(body, raw=False, ext_hook=lambda c, d: d)) is dict for _, _, body in records]
    assert all(maps) or name != "v1_deterministic_k1"  # that history is never regenerated
    with open_store(str(tmp_path / "ledger.db"), create=True) as store:
        store.create_run("golden")
        head = store._append_encoded("golden", records, 0, store.acquire_epoch("golden"))
    with open_store(str(tmp_path / "ledger.db"), readonly=True) as store:
        report = store.verify("golden")
        assert report.ok and report.head_digest == head.digest.hex()  # the chain covers the stored bytes
        assert [r.body for r in store.scan("golden")] == [body for _, _, body in records]  # never rewritten
        stored = list(store.read("golden"))
        replay(stored)  # every decision re-checked; raises on a divergence
        full = Provenance.from_events(stored)
        for v in full.published:
            assert query_events(store, "golden", "version", v).version(v) == full.version(v)
        for rid in full.requests:
            assert query_events(store, "golden", "rollout", rid).rollout(rid) == full.rollout(rid)
    # The same events written today take fewer bytes and decode to the same values.
    events = [s.event for s in stored]
    today = [encode_body(e) for e in events]
    assert [decode_body(e.KIND, e.VERSION, b) for e, b in zip(events, today, strict=True)] == events
    assert sum(map(len, today)) < 0.7 * sum(len(body) for _, _, body in records)
