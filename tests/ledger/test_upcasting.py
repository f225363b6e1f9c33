"""Schema evolution: old bodies are upcast step by step to the current event class."""

from __future__ import annotations

import pytest

from ledger import CodecError, Event, MemoryStore, Registry, decode_body, encode_body, event, pack, upcaster
from ledger.codec import encode_map_body


def _registries():
    """The same kind at three schema versions, as three releases of the software would define it."""
    v1, v3 = Registry(), Registry()

    @event("Scored", version=1, registry=v1)
    class ScoredV1(Event):
        rollout_id: int
        score: float

    @event("Scored", version=3, registry=v3)
    class ScoredV3(Event):
        rollout_id: int
        reward: float  # v2 renamed score -> reward
        verifier: str  # v3 added the verifier name

    # Bodies are arrays of field values: the upcaster from each old version names its fields.
    @upcaster("Scored", 1, registry=v3, fields=("rollout_id", "score"))
    def _v1_to_v2(body):
        body["reward"] = body.pop("score")
        return body

    @upcaster("Scored", 2, registry=v3, fields=("rollout_id", "reward"))
    def _v2_to_v3(body):
        body.setdefault("verifier", "unknown")
        return body

    return v1, v3, ScoredV1, ScoredV3


def test_old_body_is_upcast_through_every_version():
    _, v3, ScoredV1, ScoredV3 = _registries()
    old = ScoredV1(4, 0.5)
    new = decode_body("Scored", 1, pack(old.fields()), v3)
    assert isinstance(new, ScoredV3)
    assert new == ScoredV3(4, 0.5, "unknown")
    assert decode_body("Scored", 2, pack({"rollout_id": 4, "reward": 1.0}), v3) == ScoredV3(4, 1.0, "unknown")


def test_stored_old_events_read_as_current_events():
    v1, v3, ScoredV1, ScoredV3 = _registries()
    old_store = MemoryStore(registry=v1)
    old_store.create_run("r")
    epoch = old_store.acquire_epoch("r")
    old_store.append("r", [ScoredV1(1, 1.0), ScoredV1(2, 0.0)], expected_seq=0, epoch=epoch)
    old_store.registry = v3  # the same records read by newer software
    assert old_store.events("r") == [ScoredV3(1, 1.0, "unknown"), ScoredV3(2, 0.0, "unknown")]
    assert old_store.verify("r").ok  # the chain covers the stored (old) bytes


def test_missing_upcaster_is_a_codec_error():
    reg = Registry()

    @event("Gap", version=3, registry=reg)
    class Gap(Event):
        x: int

    @upcaster("Gap", 2, registry=reg)
    def _(body):
        return body

    with pytest.raises(CodecError, match="no upcaster for Gap from schema version 1"):
        decode_body("Gap", 1, pack({"x": 1}), reg)


def test_array_and_map_bodies_of_old_versions_read_alike_and_an_unknown_layout_is_named():
    v1, v3, ScoredV1, ScoredV3 = _registries()
    old = ScoredV1(4, 0.5)
    array_body, map_body = encode_body(old), encode_map_body(old)
    assert array_body != map_body and b"score" not in array_body and b"score" in map_body
    assert decode_body("Scored", 1, array_body, v3) == decode_body("Scored", 1, map_body, v3) == ScoredV3(4, 0.5, "unknown")
    plain = Registry()  # the same kinds, but the upcaster from version 1 names no fields

    @event("Scored", version=2, registry=plain)
    class ScoredV2(Event):
        rollout_id: int
        reward: float

    @upcaster("Scored", 1, registry=plain)
    def _(body):
        body["reward"] = body.pop("score")
        return body

    assert decode_body("Scored", 1, map_body, plain) == ScoredV2(4, 0.5)
    with pytest.raises(CodecError, match="Scored body of schema version 1 is an array, and no field layout"):
        decode_body("Scored", 1, array_body, plain)


def test_duplicate_registration_is_refused():
    reg = Registry()

    @event("Dup", registry=reg)
    class A(Event):
        x: int

    with pytest.raises(ValueError, match="registered twice"):

        @event("Dup", registry=reg)
        class B(Event):
            x: int


def test_version_1_leases_read_as_one_request_leases():
    from ledger import RolloutAssigned

    body = pack({"attempt": 2, "rollout_id": 7, "worker_id": "inference-0"})
    assert decode_body("RolloutAssigned", 1, body) == RolloutAssigned("inference-0", (7,), (2,))


def test_version_1_requests_read_as_one_sample_requests():
    from ledger import RolloutRequested

    body = pack({"batch": 1, "group_id": 2, "ordinal": 0, "policy_version": 0, "prompt_index": 9,
                 "rollout_id": 7, "sampling": {"max_tokens": 4}, "seed": 11})
    e = decode_body("RolloutRequested", 1, body)
    assert e == RolloutRequested((7,), 2, 1, 9, 0, (11,), {"max_tokens": 4}, 0)
    assert [(q.rollout_id, q.seed, q.group_id) for q in e.samples()] == [(7, 11, 2)]
