"""``invariants.check`` passes clean histories and names the invariant an edit breaks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ledger import events as ev
from runtime.controller.invariants import NAMES, check
from tests.runtime.controller.golden.regenerate import HERE, RUNS, load


def golden(name: str = "deterministic_k1") -> list[ev.Event]:
    return load(HERE / f"{name}.msgpack")


def where(events, kind, n=0) -> int:
    return [i for i, e in enumerate(events) if isinstance(e, kind)][n]


def found(events, **kwargs) -> set[str]:
    return {v.invariant for v in check(events, **kwargs)}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_golden_histories_hold_every_invariant(name):
    assert check(golden(name)) == []


def test_every_invariant_has_a_name():
    assert sorted(NAMES) == [f"I{i}" for i in range(1, 10)]


def test_rollout_consumed_twice_is_caught():
    events = golden()
    first, second = where(events, ev.BatchFormed, 0), where(events, ev.BatchFormed, 1)
    b1, b2 = events[first], events[second]
    # Batch 2 also takes batch 1's first group: a rollout consumed twice, a group in two batches.
    g = b1.group_ids[0]
    n = len(b1.rollout_ids) // len(b1.group_ids)
    events[second] = dataclasses.replace(
        b2, group_ids=(g,) + b2.group_ids, rollout_ids=b1.rollout_ids[:n] + b2.rollout_ids,
        policy_versions=b1.policy_versions[:n] + b2.policy_versions,
    )
    violations = check(events)
    assert {"I2", "I3"} <= {v.invariant for v in violations}
    assert any(v.invariant == "I2" and v.seq == second + 1 and "again" in v.message for v in violations)


def test_rollout_beyond_the_staleness_bound_is_caught():
    events = golden()  # k = 1: step s may use versions >= s - 2
    i = where(events, ev.BatchFormed, 3)
    b = events[i]
    # Pretend batch 4's rollouts were requested from version 0 (staleness 3).
    ids = set(b.rollout_ids)
    for j, e in enumerate(events[:i]):
        if isinstance(e, ev.RolloutRequested) and ids.intersection(e.rollout_ids):
            events[j] = dataclasses.replace(e, policy_version=0)
    events[i] = dataclasses.replace(b, policy_versions=(0,) * len(b.rollout_ids))
    violations = [v for v in check(events, decisions=False) if v.invariant == "I1"]
    assert violations and all(v.seq == i + 1 for v in violations)
    assert "staleness 3 > 1" in violations[0].message


def test_duplicate_completion_is_caught():
    events = golden()
    i = where(events, ev.RolloutCompleted, 5)
    events.insert(i + 1, events[i])
    assert "I4" in found(events)


def test_completion_from_other_weights_is_caught():
    events = golden()
    i = where(events, ev.RolloutCompleted, 0)
    events[i] = dataclasses.replace(events[i], weights_digest="0" * 64)
    assert found(events, decisions=False) == {"I4"}


def test_late_completion_of_a_discarded_group_is_caught():
    events = golden("deterministic_k0_filtered")
    d = where(events, ev.GroupDiscarded)
    gid = events[d].group_id
    rid = next(e.rollout_ids[0] for e in events if isinstance(e, ev.RolloutRequested) and e.group_id == gid)
    late = ev.RolloutCompleted(rid, "zombie", 0, 0, "x" * 64, np.zeros(2, np.int32), np.zeros(2, np.float32), "stop")
    events.insert(d + 1, late)
    assert any(v.invariant == "I4" and "late" in v.message for v in check(events, decisions=False))


def test_retiring_a_needed_version_is_caught():
    events = golden()
    i = where(events, ev.WeightsPublished, 2)  # version 2 is the newest here
    events.insert(i + 1, ev.VersionsRetired((2,)))
    violations = [v for v in check(events) if v.invariant == "I5"]
    assert violations and "newest" in violations[0].message


def test_broken_version_chain_is_caught():
    events = golden()
    i = where(events, ev.WeightsPublished, 2)
    events[i] = dataclasses.replace(events[i], parent_digest="f" * 64)
    assert "I8" in found(events, decisions=False)


def test_stored_weights_must_match_their_digests():
    events = golden()
    digests = {e.version: e.digest for e in events if isinstance(e, ev.WeightsPublished)}
    assert check(events, digest_of=digests.get, decisions=False) == []
    digests[3] = "0" * 64
    violations = check(events, digest_of=digests.get, decisions=False)
    assert [v.invariant for v in violations] == ["I8"] and "version 3" in violations[0].message
    assert check(events, digest_of=lambda v: None, decisions=False) == []  # evicted: nothing to compare


def test_deterministic_batch_with_a_foreign_seed_is_caught():
    events = golden()
    i = where(events, ev.RolloutRequested, 0)
    seeds = events[i].seeds
    events[i] = dataclasses.replace(events[i], seeds=(seeds[0] ^ 1, *seeds[1:]))
    kinds = found(events)
    assert {"I6", "I7"} <= kinds
