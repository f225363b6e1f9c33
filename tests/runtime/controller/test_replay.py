"""Replay of committed golden histories, and the divergences it must report."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from ledger import events as ev
from ledger import open_store
from runtime.controller import ReplayDivergence, replay
from runtime.controller.admit import DECISION_KINDS
from runtime.controller.invariants import check
from runtime.controller.loop import ControllerLoop
from runtime.controller.reduce import fold
from runtime.controller.simulation import run_to_end
from tests.runtime.controller.golden.regenerate import HERE, RUNS, altered, load, simulate

GOLDEN = sorted(RUNS)


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_history_replays(name):
    events = load(HERE / f"{name}.msgpack")
    state = replay(events)
    assert state.finished and state.trained == state.spec.steps == 4
    assert state == fold(events)
    # The run ended where the ledger says, with the digest it names.
    finished = events[-1]
    assert isinstance(finished, ev.RunFinished) and state.versions[4] == finished.final_digest


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_history_is_what_the_controller_writes_today(name):
    # RunStarted stores the whole config, which grows with new fields; everything after it is
    # decided by the pinned values alone.
    today, golden = simulate(RUNS[name]), load(HERE / f"{name}.msgpack")
    assert today[1:] == golden[1:], (
        "the controller's decisions changed; if on purpose, regenerate the golden files "
        "(python -m tests.runtime.controller.golden.regenerate)"
    )
    assert today[0].seed == golden[0].seed


def test_a_history_of_one_sample_requests_and_leases_still_replays():
    # Written when RolloutRequested and RolloutAssigned named one rollout each (schema version
    # 1): its records are upcast, a group spans several request events, and the decisions
    # check against today's (one event per group, one per worker) split into those parts.
    events = load(HERE / "v1_deterministic_k1.msgpack")
    requests = [e for e in events if isinstance(e, ev.RolloutRequested)]
    leases = [e for e in events if isinstance(e, ev.RolloutAssigned)]
    assert requests and all(len(e.rollout_ids) == len(e.seeds) == 1 for e in requests)
    assert leases and all(len(e.rollout_ids) == 1 for e in leases)
    today = load(HERE / "deterministic_k1.msgpack")
    state = replay(events)
    assert state == replay(events, check=False)
    assert state._replace(config_digest="") == replay(today)._replace(config_digest="")  # the config grew since
    assert events[-1] == today[-1]  # the same final version and digest
    assert check(events) == []  # and the audit's invariants, I6 included, hold


def test_a_run_written_with_one_sample_requests_resumes_to_the_same_end():
    records = msgpack.unpackb((HERE / "v1_deterministic_k1.msgpack").read_bytes(), raw=False)
    events = load(HERE / "v1_deterministic_k1.msgpack")
    # Cut after the decision run that requests batch 3 (a committed transaction's end).
    i = next(j for j, e in enumerate(events) if isinstance(e, ev.RolloutRequested) and e.batch == 3)
    cut = next(j for j in range(i + 1, len(events)) if type(events[j]) not in DECISION_KINDS)
    store = open_store("memory://")
    store.create_run("golden")
    store._append_encoded("golden", [tuple(r) for r in records[:cut]], 0, store.acquire_epoch("golden"))
    assert [r.version for r in store.scan("golden") if r.kind == "RolloutRequested"][0] == 1  # stored as written
    loop = ControllerLoop.resume(store, "golden")
    run_to_end(loop, workers=2, slots=2)
    assert store.events("golden")[-1] == events[-1]  # the same final version and digest
    assert check(store.events("golden")) == []


def test_a_split_decision_must_match_part_by_part():
    events = load(HERE / "v1_deterministic_k1.msgpack")
    i = _index(events, ev.RolloutRequested, 4)  # the second sample of the second group
    events[i] = dataclasses.replace(events[i], seeds=(events[i].seeds[0] + 1,))
    with pytest.raises(ReplayDivergence) as info:
        replay(events)
    assert (info.value.seq, info.value.field) == (i + 1, "seeds")
    events = load(HERE / "v1_deterministic_k1.msgpack")
    j = _index(events, ev.RolloutRequested, 1)
    events[j], events[j + 1] = events[j + 1], events[j]  # two parts out of order
    with pytest.raises(ReplayDivergence) as info:
        replay(events)
    assert (info.value.seq, info.value.field) == (j + 1, "rollout_ids")


def test_altered_history_raises_with_seq_and_field():
    events = load(HERE / "altered.msgpack")
    _, seq = altered(load(HERE / "deterministic_k1.msgpack"))
    with pytest.raises(ReplayDivergence) as info:
        replay(events)
    err = info.value
    assert (err.seq, err.kind, err.field) == (seq, "RolloutRequested", "seeds")
    assert err.logged[1] == err.decided[1] + 1
    assert f"seq {seq}" in str(err) and "'seeds'" in str(err)


def test_replay_of_stored_events_names_ledger_seqs():
    events = load(HERE / "altered.msgpack")
    store = open_store("memory://")
    store.create_run("r")
    epoch = store.acquire_epoch("r")
    store.append("r", events[:3], expected_seq=0, epoch=epoch)
    store.append("r", events[3:], expected_seq=3, epoch=epoch)
    with pytest.raises(ReplayDivergence) as info:
        replay(store.read("r"))
    assert info.value.seq == altered(load(HERE / "deterministic_k1.msgpack"))[1]


def _golden() -> list[ev.Event]:
    return load(HERE / "deterministic_k1.msgpack")


def _index(events, kind, n=0):
    return [i for i, e in enumerate(events) if isinstance(e, kind)][n]


def test_missing_decision_is_reported():
    events = _golden()
    i = _index(events, ev.PromptsSampled, 1)
    assert isinstance(events[i + 1], ev.RolloutRequested)
    with pytest.raises(ReplayDivergence) as info:
        replay(events[:i] + events[i + 1 :])
    err = info.value
    assert (err.seq, err.field, err.logged, err.decided) == (i + 1, "kind", "RolloutRequested", "PromptsSampled")


def test_missing_decision_between_inputs_cannot_fold():
    events = _golden()
    i = _index(events, ev.BatchFormed)
    with pytest.raises(ReplayDivergence) as info:
        replay(events[:i] + events[i + 1 :])
    assert info.value.seq > i  # the next event that needs the batch cannot follow


def test_extra_decision_is_reported():
    events = _golden()
    i = _index(events, ev.RolloutAssigned, 3)
    with pytest.raises(ReplayDivergence) as info:
        replay(events[: i + 1] + [events[i]] + events[i + 1 :])
    assert info.value.seq == i + 2 and info.value.kind == "RolloutAssigned"


def test_duplicate_input_cannot_be_folded():
    events = _golden()
    i = _index(events, ev.RolloutCompleted, 2)
    with pytest.raises(ReplayDivergence) as info:
        replay(events[: i + 1] + [events[i]] + events[i + 1 :])
    assert info.value.seq == i + 2 and info.value.field == "event"


def test_truncated_decisions_at_the_end_are_reported():
    events = _golden()
    with pytest.raises(ReplayDivergence) as info:
        replay(events[:-1])  # RunFinished cut
    assert info.value.decided == "RunFinished"
    assert replay(events[:-1], check=False).finished is False


def test_changed_batch_order_is_reported_by_field():
    events = _golden()
    i = _index(events, ev.BatchFormed, 1)
    b = events[i]
    events[i] = dataclasses.replace(b, rollout_ids=tuple(reversed(b.rollout_ids)))
    with pytest.raises(ReplayDivergence) as info:
        replay(events)
    assert (info.value.seq, info.value.field) == (i + 1, "rollout_ids")
