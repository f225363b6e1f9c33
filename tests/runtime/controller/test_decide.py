"""Scheduling decisions on hand-built histories: staleness, filtering, retention, leases."""

from __future__ import annotations

import pytest

from ledger import events as ev
from ledger import open_store
from runtime.config import load_config
from runtime.controller import ControllerLoop, decide
from runtime.controller.invariants import check
from runtime.controller.reduce import InvalidEvent, fold, reduce
from runtime.controller.simulation import SimInference, SimTrainer, SimVerifier, train_once
from runtime.controller.workers import INFERENCE, VERIFIER


def start(*overrides, size=8):
    config = load_config(None, ["run.steps=4", "sampling.group_size=2", "scheduling.groups_per_batch=2", *overrides],
                         data_size=size)
    store = open_store("memory://")
    loop = ControllerLoop.create(store, run_id="r", config=config.to_dict(), config_digest=config.digest(), seed=1,
                                 clock=lambda: 0.0)
    return store, loop


def publish_v0(loop):
    train_once(loop, SimTrainer(seed=1))


def requested(store):
    """Every requested sample, in id order."""
    return [q for e in store.events("r") if isinstance(e, ev.RolloutRequested) for q in e.samples()]


@pytest.mark.parametrize("k, batches", [(0, {1}), (1, {1, 2}), (2, {1, 2, 3})])
def test_deterministic_mode_requests_every_batch_its_staleness_allows(k, batches):
    store, loop = start(f"scheduling.max_staleness={k}")
    assert requested(store) == []  # nothing before version 0
    publish_v0(loop)
    reqs = requested(store)
    assert {r.batch for r in reqs} == batches and {r.policy_version for r in reqs} == {0}
    assert len(reqs) == len(batches) * 4  # 2 groups of 2
    assert [r.rollout_id for r in reqs] == list(range(len(reqs)))


def run_steps(loop, store, n, verifier=None, worker=None, each=None):
    """Train, sample and score until ``n`` steps are trained; ``each()`` before every round."""
    verifier = verifier or SimVerifier()
    worker = worker or SimInference("w", 8)
    trainer = SimTrainer(seed=1)
    for _ in range(200):
        if loop.state.trained >= n:
            return
        if each is not None:
            each()
        train_once(loop, trainer)
        leases = loop.leases("w")
        if leases:
            loop.complete(worker.generate(leases))
        tasks = loop.scoring_work("v", 100)
        if tasks:
            loop.record_outcomes(verifier.score(tasks))
    raise AssertionError("no progress")


@pytest.mark.parametrize("k", [0, 1, 2])
def test_batch_s_samples_from_version_s_minus_1_minus_k(k):
    store, loop = start(f"scheduling.max_staleness={k}", "run.steps=5")
    loop.join("w", INFERENCE, slots=8)
    loop.join("v", VERIFIER)
    run_steps(loop, store, 5)
    batches = [e for e in store.events("r") if isinstance(e, ev.BatchFormed)]
    assert [set(b.policy_versions) for b in batches] == [{max(0, s - 1 - k)} for s in range(1, 6)]
    assert loop.finished


def test_uniform_groups_are_replaced_and_discarded_in_ordinal_order():
    # Prompts that are multiples of 4 always get reward 0 (simulation), so their groups are uniform.
    store, loop = start("scheduling.max_staleness=0", "scheduling.filter_groups=true", "sampling.group_size=3")
    loop.join("w", INFERENCE, slots=8)
    loop.join("v", VERIFIER)
    run_steps(loop, store, 4)
    events = store.events("r")
    groups = {e.group_id: e for e in events if isinstance(e, ev.RolloutRequested)}
    for b in (e for e in events if isinstance(e, ev.BatchFormed)):
        ordinals = [groups[g].ordinal for g in b.group_ids]
        assert ordinals == sorted(ordinals)
    discarded = [e for e in events if isinstance(e, ev.GroupDiscarded)]
    assert discarded and all(d.reason == "uniform_reward" for d in discarded)
    rewards = {e.rollout_id: e.reward for e in events if isinstance(e, ev.OutcomeRecorded)}
    members = {}
    for e in events:
        if isinstance(e, ev.RolloutRequested):
            members.setdefault(e.group_id, []).extend(rewards[rid] for rid in e.rollout_ids)
    assert all(len(set(members[d.group_id])) == 1 for d in discarded)
    replacements = [e for e in events if isinstance(e, ev.PromptsSampled) and e.position == -1]
    assert len(replacements) >= len(discarded)  # every dropped group was replaced by a new draw


def _filtered_run(ahead: int, slots: int):
    """A 4-step filtered run with ``draw_ahead=ahead`` on a worker of ``slots`` slots: each
    batch's (ordinal, prompt) pairs, the most groups in flight for one batch, the discards."""
    store, loop = start("scheduling.max_staleness=0", "scheduling.filter_groups=true", "sampling.group_size=3",
                        "scheduling.max_groups_per_batch=8", f"scheduling.draw_ahead={ahead}", size=16)
    loop.join("w", INFERENCE, slots=slots)
    loop.join("v", VERIFIER)
    in_flight = [0]

    def count():
        in_flight.extend(len(p.groups) - p.resolved for p in loop.state.plans.values())

    run_steps(loop, store, 4, worker=SimInference("w", slots), each=count)
    most = max(in_flight)
    events = store.events("r")
    groups = {e.group_id: e for e in events if isinstance(e, ev.RolloutRequested)}
    batches = [[(groups[g].ordinal, groups[g].prompt_index) for g in b.group_ids]
               for b in events if isinstance(b, ev.BatchFormed)]
    return batches, most, [e.reason for e in events if isinstance(e, ev.GroupDiscarded)]


def test_draw_ahead_keeps_more_groups_in_flight_and_forms_the_same_batches():
    # I7: a batch's groups are the lowest non-uniform ordinals whatever was requested beyond them.
    batches, most, reasons = _filtered_run(0, 8)
    assert most <= 2 and set(reasons) == {"uniform_reward"}
    assert any(ordinal >= 2 for batch in batches for ordinal, _ in batch)  # some replaced a uniform group
    for ahead, slots in ((2, 8), (3, 8), (3, 2)):
        got, most_ahead, reasons_ahead = _filtered_run(ahead, slots)
        assert got == batches, (ahead, slots)
        assert most_ahead > most
        assert set(reasons_ahead) <= {"uniform_reward", "surplus"}
    assert "surplus" in _filtered_run(3, 8)[2]  # good groups past the batch are dropped as such


@pytest.mark.parametrize("overrides, message", [
    (["scheduling.draw_ahead=-1"], "scheduling.draw_ahead"),
    (["scheduling.draw_ahead=2", "scheduling.mode=freshest", "scheduling.filter_groups=true"], "deterministic"),
    (["scheduling.draw_ahead=2", "scheduling.filter_groups=false"], "filter_groups"),
    (["scheduling.draw_ahead=2"], "filter_groups"),  # the default algorithm filters nothing
])
def test_draw_ahead_is_refused_where_it_does_nothing(overrides, message):
    from runtime.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides, data_size=8).resolved(data_size=8)


def test_freshest_mode_discards_stale_groups_and_requests_from_the_newest():
    store, loop = start("scheduling.mode=freshest", "scheduling.max_staleness=0", "run.steps=3")
    loop.join("w", INFERENCE, slots=1)
    loop.join("v", VERIFIER)
    publish_v0(loop)
    w, v, t = SimInference("w", 1), SimVerifier(), SimTrainer(seed=1)
    # Complete and score one batch; the other live groups stay behind.
    for _ in range(20):
        if loop.state.formed:
            break
        loop.complete(w.generate(loop.leases("w")))
        loop.record_outcomes(v.score(loop.scoring_work("v", 10)))
    assert loop.state.formed == 1
    train_once(loop, t)  # version 1: the next batch needs version >= 1
    events = store.events("r")
    stale = [e for e in events if isinstance(e, ev.GroupDiscarded)]
    assert all(e.reason == "stale" for e in stale)
    live = loop.state.groups.values()
    assert live and all(g.policy_version == 1 for g in live)


def test_retention_keeps_the_newest_and_version_0_and_what_requests_need():
    store, loop = start("scheduling.max_staleness=1", "params.keep_newest=2", "run.steps=5")
    loop.join("w", INFERENCE, slots=8)
    loop.join("v", VERIFIER)
    run_steps(loop, store, 5)
    retired = [v for e in store.events("r") if isinstance(e, ev.VersionsRetired) for v in e.versions]
    # keep_newest 2 (max_staleness + 1, the least a run resolves to): versions up to latest - 2 go
    # once nothing needs them; 0 is the root; the run ends as version 5 appears, so 3 stays.
    assert retired == [1, 2]
    assert sorted(loop.state.versions.keys()) == [0, 3, 4, 5]


@pytest.mark.parametrize("k, every, steps, retired, kept", [
    (0, 2, 5, [1, 3], [0, 2, 4, 5]),
    # With staleness 1 a checkpoint keeps the version before it too: the old log-probs of the
    # step after it read that version.
    (1, 3, 7, [1, 4], [0, 2, 3, 5, 6, 7]),
])
def test_keep_every_keeps_checkpoints_and_the_versions_the_steps_after_them_read(k, every, steps, retired, kept):
    store, loop = start(f"scheduling.max_staleness={k}", f"params.keep_newest={k + 1}", f"params.keep_every={every}",
                        f"run.steps={steps}")
    loop.join("w", INFERENCE, slots=8)
    loop.join("v", VERIFIER)
    run_steps(loop, store, steps)
    events = store.events("r")
    assert [v for e in events if isinstance(e, ev.VersionsRetired) for v in e.versions] == retired
    assert sorted(loop.state.versions.keys()) == kept
    assert [v for v in check(events) if v.invariant == "I5"] == []


def test_retiring_a_checkpoint_breaks_i5():
    store, loop = start("scheduling.max_staleness=0", "params.keep_newest=1", "params.keep_every=2", "run.steps=5")
    loop.join("w", INFERENCE, slots=8)
    loop.join("v", VERIFIER)
    run_steps(loop, store, 5)
    events = [ev.VersionsRetired((2, 3)) if isinstance(e, ev.VersionsRetired) and 3 in e.versions else e
              for e in store.events("r")]
    (violation,) = [v for v in check(events, decisions=False) if v.invariant == "I5"]
    assert "retires version 2, which params.keep_every 2 keeps" in violation.message
    # Folding refuses it too: retention's decision rule counts on every checkpoint being there.
    before = fold([e for e in store.events("r") if not (isinstance(e, ev.VersionsRetired) and 3 in e.versions)])
    with pytest.raises(InvalidEvent, match="a checkpoint params.keep_every 2 keeps"):
        reduce(before, ev.VersionsRetired((2,)))


def test_decide_is_pure_and_reaches_a_fixpoint():
    store, loop = start("scheduling.max_staleness=1")
    loop.join("w", INFERENCE, slots=3)
    publish_v0(loop)
    s = loop.state
    assert decide(s) == []  # the loop appended everything decide wanted
    before = fold(store.events("r")[:-5])
    assert decide(before) == decide(before)


def test_leases_go_out_in_id_order_to_workers_in_join_order():
    store, loop = start("scheduling.max_staleness=0")
    loop.join("a", INFERENCE, slots=2)
    loop.join("b", INFERENCE, slots=1)
    publish_v0(loop)
    assert [lease.rollout_id for lease in loop.leases("a")] == [0, 1]
    assert [lease.rollout_id for lease in loop.leases("b")] == [2]
    assert loop.state.pending == (3,)
    assigned = [e for e in store.events("r") if isinstance(e, ev.RolloutAssigned)]
    assert assigned == [ev.RolloutAssigned("a", (0, 1), (0, 0)), ev.RolloutAssigned("b", (2,), (0,))]


def test_a_lease_event_is_checked_whole_before_it_folds():
    store, loop = start("scheduling.max_staleness=0")
    publish_v0(loop)  # four pending requests, no worker yet
    s = fold([ev.WorkerJoined("w", INFERENCE, {}, 3)], loop.state)
    assert s.pending == (0, 1, 2, 3)
    bad = {
        "out of id order": ev.RolloutAssigned("w", (1, 0), (0, 0)),
        "twice": ev.RolloutAssigned("w", (2, 2), (0, 0)),
        "wrong attempt": ev.RolloutAssigned("w", (0, 1), (0, 1)),
        "too many for the slots": ev.RolloutAssigned("w", (0, 1, 2, 3), (0, 0, 0, 0)),
        "ids and attempts differ in length": ev.RolloutAssigned("w", (0, 1), (0,)),
        "empty": ev.RolloutAssigned("w", (), ()),
        "unknown worker": ev.RolloutAssigned("x", (0,), (0,)),
    }
    for why, e in bad.items():
        with pytest.raises(InvalidEvent):
            reduce(s, e)
            pytest.fail(why)
    after = reduce(s, ev.RolloutAssigned("w", (1, 3), (0, 0)))  # not a prefix of the pending ids
    assert after.pending == (0, 2)
    assert [after.requests[r].holder for r in range(4)] == [None, "w", None, "w"]
    assert after.workers["w"].active == 2 and after.free == s.free  # one slot left
    full = reduce(after, ev.RolloutAssigned("w", (0,), (0,)))
    assert full.free == () and full.pending == (2,)


def test_a_group_request_is_checked_whole_and_a_group_may_span_events():
    store, loop = start("scheduling.max_staleness=0")  # groups of 2
    s = fold([ev.WeightsPublished(0, "d0", -1, "")], loop.state)
    sampling = loop.state.spec.sampling
    bad = {
        "more samples than a group": ev.RolloutRequested((0, 1, 2), 0, 1, 5, 0, (1, 2, 3), sampling, 0),
        "ids not from the next id": ev.RolloutRequested((1, 2), 0, 1, 5, 0, (1, 2), sampling, 0),
        "ids not consecutive": ev.RolloutRequested((0, 2), 0, 1, 5, 0, (1, 2), sampling, 0),
        "a seed missing": ev.RolloutRequested((0, 1), 0, 1, 5, 0, (1,), sampling, 0),
        "an unpublished version": ev.RolloutRequested((0, 1), 0, 1, 5, 1, (1, 2), sampling, 0),
    }
    for why, e in bad.items():
        with pytest.raises(InvalidEvent):
            reduce(s, e)
            pytest.fail(why)
    half = reduce(s, ev.RolloutRequested((0,), 0, 1, 5, 0, (1,), sampling, 0))
    whole = reduce(half, ev.RolloutRequested((1,), 0, 1, 5, 0, (2,), sampling, 0))
    assert whole == reduce(s, ev.RolloutRequested((0, 1), 0, 1, 5, 0, (1, 2), sampling, 0))
    assert whole.groups[0].rollout_ids == (0, 1) and whole.pending == (0, 1)
    with pytest.raises(InvalidEvent, match="no room"):
        reduce(whole, ev.RolloutRequested((2,), 0, 1, 5, 0, (3,), sampling, 0))


def test_reduce_rejects_events_that_cannot_follow():
    store, loop = start()
    loop.join("w", INFERENCE, slots=64)
    publish_v0(loop)
    s = loop.state
    with pytest.raises(InvalidEvent, match="not a live request"):
        reduce(s, ev.RolloutAssigned("w", (999,), (0,)))
    with pytest.raises(InvalidEvent, match="already joined"):
        reduce(s, ev.WorkerJoined("w", INFERENCE))
    with pytest.raises(InvalidEvent, match="version 3"):
        reduce(s, ev.WeightsPublished(3, "d", 2, "p"))


@pytest.mark.parametrize("every", [0, 1, 2, 3, 5])
@pytest.mark.parametrize("k", [0, 1, 2, 4])
def test_the_count_of_kept_versions_matches_the_rule(every, k):
    from runtime.controller.spec import ControllerSpec

    spec = ControllerSpec(1, 50, 8, 2, 2, "deterministic", k, False, 4, k + 1, {}, keep_every=every)
    assert [spec.kept_through(n) for n in range(40)] == [sum(map(spec.kept, range(1, n + 1))) for n in range(40)]
    assert not spec.kept(0)
