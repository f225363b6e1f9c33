"""The I/O shell: admission verdicts, fencing, lease expiry and resume."""

from __future__ import annotations

import pytest

from ledger import events as ev
from ledger import open_store
from runtime.config import load_config
from runtime.controller import ControllerFenced, ControllerLoop, replay
from runtime.controller.simulation import SimInference, SimTrainer, run_to_end, train_once
from runtime.controller.workers import INFERENCE


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def start(store, clock, *overrides):
    config = load_config(None, ["run.steps=3", "sampling.group_size=2", "scheduling.groups_per_batch=2", *overrides],
                         data_size=8)
    return ControllerLoop.create(store, run_id="r", config=config.to_dict(), config_digest=config.digest(), seed=1,
                                 clock=clock, lease_timeout_s=5.0)


def test_duplicate_and_foreign_completions_are_rejected_and_not_written():
    store, clock = open_store("memory://"), Clock()
    loop = start(store, clock)
    loop.join("w", INFERENCE, slots=4)
    train_once(loop, SimTrainer(seed=1))
    done = SimInference("w", 4).generate(loop.leases("w"))
    assert all(v.accepted for v in loop.complete(done))
    head = store.head("r").seq
    again = loop.complete(done[:1])[0]
    assert not again.accepted and "duplicate" in again.reason
    forged = ev.RolloutCompleted(99, "w", 0, 0, "d", done[0].tokens, done[0].logprobs, "stop")
    assert "never requested" in loop.complete([forged])[0].reason
    assert store.head("r").seq == head and loop.rejected == 2


def test_silent_worker_is_lost_and_its_leases_go_to_another():
    store, clock = open_store("memory://"), Clock()
    loop = start(store, clock)
    loop.join("a", INFERENCE, slots=4)
    loop.join("b", INFERENCE, slots=4)
    train_once(loop, SimTrainer(seed=1))
    assert len(loop.leases("a")) == 4
    clock.now = 6.0
    loop.heartbeat("b")
    loop.expire()
    events = store.events("r")
    assert ev.WorkerLost("a", "heartbeat timeout") in events
    assert [lease.attempt for lease in loop.leases("b")] == [1, 1, 1, 1]


def test_stuck_lease_expires_while_the_worker_lives():
    store, clock = open_store("memory://"), Clock()
    loop = start(store, clock)
    loop.join("a", INFERENCE, slots=1)
    train_once(loop, SimTrainer(seed=1))
    first = loop.leases("a")[0]
    clock.now = 6.0
    loop.heartbeat("a")
    loop.expire()
    assert ev.RolloutAbandoned(first.rollout_id, 0, "lease expired") in store.events("r")
    assert loop.leases("a")[0].attempt == 1
    # The first attempt finishes late but its request is still open: accepted once.
    assert loop.complete(SimInference("a").generate([first]))[0].accepted


def test_zombie_controller_is_fenced_and_resume_continues_the_run(tmp_path):
    path = "sqlite:///" + str(tmp_path / "ledger.db")
    store, clock = open_store(path, create=True), Clock()
    old = start(store, clock)
    old.join("w", INFERENCE, slots=2)
    train_once(old, SimTrainer(seed=1))
    leased = old.leases("w")
    assert leased
    new = ControllerLoop.resume(open_store(path), "r", clock=clock)
    assert new.state.epoch == 2 and not new.state.workers and set(new.state.pending) >= {lease.rollout_id for lease in leased}
    head = store.head("r").seq
    with pytest.raises(ControllerFenced, match="fenced"):
        old.complete(SimInference("w", 2).generate(leased))
    assert store.head("r").seq == head
    run_to_end(new)
    assert replay(open_store(path).read("r")).finished
