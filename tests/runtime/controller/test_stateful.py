"""The controller under simulated workers and faults, as a hypothesis state machine.

Rules deliver completions in any order, duplicate and late ones, kill workers (their leases
expire), kill the trainer mid-step, restart the controller from its SQLite ledger and let the
old one try to append. The controller writes a snapshot every few events (a drawn
``snapshot_every``), and a restart resumes from the newest one. After every step: the ledger
satisfies I1–I8 (including a full replay with decision checking, I6), folding it reproduces the
state the live controller had after each of its commits, every snapshot written since is the
fold up to its seq, and recovering from the newest snapshot (folding only the tail, decisions
checked) gives the state and rollout cache of the fold from seq 1. At the end the run is driven to completion without faults and, in
deterministic mode, its batch and weight digests must equal an undisturbed run's (I7).

Four variants (deterministic / freshest, with and without DAPO filtering), each with 15
examples of up to 30 steps in the "ci" profile (about 25 s in all here) and 250 under
HYPOTHESIS_PROFILE=nightly (1,000 in all).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import event, settings, target
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ledger import events as ev
from ledger.sql import SqliteStore
from runtime.config import load_config
from runtime.controller import ControllerFenced, ControllerLoop, snapshot
from runtime.controller.invariants import check
from runtime.controller.reduce import reduce
from runtime.controller.simulation import SimInference, SimTrainer, SimVerifier, run_to_end, train_once
from runtime.controller.state import INITIAL
from runtime.controller.workers import INFERENCE, TRAINER, VERIFIER, InitTask

EXAMPLES = {"nightly": 250}.get(os.environ.get("HYPOTHESIS_PROFILE", "ci"), 15)  # per variant
TIMEOUT = 10.0


def digests(events) -> list[tuple[str, str]]:
    """(batch digest, weights digest) per step: what I7 says timing cannot change."""
    out, pending = [], {}
    for e in events:
        if isinstance(e, ev.TrainStepCompleted):
            pending[e.step] = e.batch_digest
        elif isinstance(e, ev.WeightsPublished) and e.version > 0:
            out.append((pending[e.version], e.digest))
    return out


_REFERENCE: dict[tuple, list] = {}


def reference(config) -> list[tuple[str, str]]:
    key = config.digest()
    if key not in _REFERENCE:
        from ledger import open_store

        store = open_store("memory://")
        loop = ControllerLoop.create(store, run_id="ref", config=config.to_dict(), config_digest=key, seed=config.run.seed)
        run_to_end(loop, workers=1, slots=1)
        _REFERENCE[key] = digests(store.events("ref"))
    return _REFERENCE[key]


class ControllerMachine(RuleBasedStateMachine):
    MODE = "deterministic"
    FILTER = False

    @initialize(
        k=st.integers(0, 2),
        group_size=st.integers(1, 3),
        groups=st.integers(1, 3),
        steps=st.integers(2, 4),
        size=st.integers(3, 12),
        keep=st.integers(1, 2),
        every=st.integers(0, 3),
        seed=st.integers(0, 2**32),
        workers=st.lists(st.integers(1, 3), min_size=1, max_size=3),
        snapshot_every=st.integers(2, 16),
        ahead=st.integers(0, 2),
    )
    def start(self, k, group_size, groups, steps, size, keep, every, seed, workers, snapshot_every, ahead):
        mode, filter_groups = self.MODE, self.FILTER
        self.config = load_config(None, [
            f"scheduling.mode={mode}", f"scheduling.max_staleness={k}", f"scheduling.filter_groups={str(filter_groups).lower()}",
            f"sampling.group_size={group_size}", f"scheduling.groups_per_batch={groups}",
            f"scheduling.max_groups_per_batch={2 * groups}", f"run.steps={steps}", f"params.keep_newest={keep}",
            f"params.keep_every={every}", f"run.seed={seed}",
            f"scheduling.draw_ahead={ahead if filter_groups and mode == 'deterministic' else 0}",
        ], data_size=size)
        event(f"mode={mode} k={k} filter={filter_groups}")
        self.dir = tempfile.mkdtemp(prefix="rlx-ctl-")
        self.path = os.path.join(self.dir, "ledger.db")
        self.now = 0.0
        self.snapshot_every = snapshot_every
        self.store = self._open()
        self.loop = ControllerLoop.create(self.store, run_id="run", config=self.config.to_dict(),
                                          config_digest=self.config.digest(), seed=seed, **self._loop_args())
        self.zombie: ControllerLoop | None = None
        self.workers = {f"w{i}": SimInference(f"w{i}", slots) for i, slots in enumerate(workers)}
        self.alive = set(self.workers)
        self.verifier, self.trainer = SimVerifier("v0"), SimTrainer("t0", seed)
        self.stash: list[ev.RolloutCompleted] = []
        self.snapshots = {}
        self.folded_seq, self.folded = 0, INITIAL
        self.faults = 0
        self._join_all()

    def _open(self):
        return SqliteStore("sqlite:///" + self.path, create=True, synchronous="OFF")

    def _loop_args(self):
        return {"clock": lambda: self.now, "lease_timeout_s": TIMEOUT, "snapshot_every": self.snapshot_every}

    def _note(self):
        self.snapshots[self.loop.head_seq] = self.loop.state

    def _join_all(self):
        for wid in sorted(self.alive):
            self.loop.join(wid, INFERENCE, slots=self.workers[wid].slots)
        self.loop.join("v0", VERIFIER)
        self.loop.join("t0", TRAINER)
        self._note()

    def teardown(self):
        try:
            if hasattr(self, "loop") and not self.loop.finished:
                self._finish()
        finally:
            if hasattr(self, "store"):
                self.store.close()
                shutil.rmtree(self.dir, ignore_errors=True)

    def _finish(self):
        """Drive the run to its end without faults, then compare with an undisturbed run."""
        self.now += 2 * TIMEOUT
        for wid in sorted(self.alive):
            self.loop.heartbeat(wid)
        self.loop.heartbeat("v0")
        self.loop.heartbeat("t0")
        self.loop.expire()
        if not self.alive:
            self.workers["late"] = SimInference("late", 2)
            self.alive.add("late")
            self.loop.join("late", INFERENCE, slots=2)
        for _ in range(10_000):
            if self.loop.finished:
                break
            self.now += 2 * TIMEOUT  # whatever was handed out before is re-offered
            for wid in sorted(self.alive):
                self.loop.heartbeat(wid)
            train_once(self.loop, self.trainer)
            for wid in sorted(self.alive):
                leases = self.loop.leases(wid)
                if leases:
                    self.loop.complete(self.workers[wid].generate(leases))
            tasks = self.loop.scoring_work("v0", 1 << 20)
            if tasks:
                self.loop.record_outcomes(self.verifier.score(tasks))
            self.loop.expire()
        assert self.loop.finished
        self._note()
        self.check_log()
        events = self.store.events("run")
        assert not check(events)
        target(float(self.faults), label="faults injected")
        if self.config.scheduling.mode == "deterministic":
            assert digests(events) == reference(self.config)

    # -- rules: inference ----------------------------------------------------------------------

    @rule(data=st.data())
    def complete_some(self, data):
        live = sorted(w for w in self.alive if self.loop.leases(w))
        if not live:
            return
        wid = data.draw(st.sampled_from(live))
        leases = self.loop.leases(wid)
        chosen = data.draw(st.lists(st.sampled_from(leases), min_size=1, max_size=len(leases), unique_by=lambda lease: lease.rollout_id))
        done = self.workers[wid].generate(chosen)
        self.stash.extend(done[:2])
        verdicts = self.loop.complete(done)
        assert all(v.accepted for v in verdicts), verdicts
        if data.draw(st.booleans()):
            verdict = self.loop.complete(done[-1:])[0]
            assert not verdict.accepted and "duplicate" in verdict.reason
            event("duplicate completion rejected")
            self.faults += 1
        self._note()

    @rule(data=st.data())
    def resubmit(self, data):
        """A duplicate from a zombie worker, or a late one after its lease was given up."""
        if not self.stash:
            return
        c = data.draw(st.sampled_from(self.stash))
        r = self.loop.state.requests.get(c.rollout_id)
        verdict = self.loop.complete([c])[0]
        if r is None or r.done:
            assert not verdict.accepted
            event("duplicate or late completion rejected")
            self.faults += 1
        elif verdict.accepted:
            event("late completion of an open request accepted")
        self._note()

    @rule(data=st.data())
    def kill_worker(self, data):
        if not self.alive:
            return
        wid = data.draw(st.sampled_from(sorted(self.alive)))
        # It may have finished some work it never reports: the stash lets it come back as a zombie.
        leases = self.loop.leases(wid)
        self.stash.extend(self.workers[wid].generate(leases[:1]))
        self.alive.discard(wid)
        event("inference worker killed")
        self.faults += 1

    @rule(slots=st.integers(1, 3))
    def add_worker(self, slots):
        wid = f"w{len(self.workers)}"
        self.workers[wid] = SimInference(wid, slots)
        self.alive.add(wid)
        self.loop.join(wid, INFERENCE, slots=slots)
        self._note()

    @rule()
    def time_passes(self):
        """A lease period passes: silent workers are lost, old leases are given back."""
        self.now += TIMEOUT
        for wid in sorted(self.alive):
            self.loop.heartbeat(wid)
        self.loop.heartbeat("v0")
        self.loop.heartbeat("t0")
        verdicts = self.loop.expire()
        if verdicts:
            event("leases expired or workers lost")
            self.faults += 1
        self._note()

    # -- rules: verifier and trainer -------------------------------------------------------------

    @rule(data=st.data())
    def score_some(self, data):
        tasks = self.loop.scoring_work("v0", data.draw(st.integers(1, 6)))
        if not tasks:
            return
        outcomes = self.verifier.score(tasks)
        keep = data.draw(st.lists(st.sampled_from(outcomes), min_size=1, unique_by=lambda o: o.rollout_id))
        assert all(v.accepted for v in self.loop.record_outcomes(keep))
        self._note()

    @rule()
    def train(self):
        if train_once(self.loop, self.trainer):
            self._note()

    @rule()
    def trainer_dies_mid_step(self):
        task = self.loop.train_task("t0")
        if task is None:
            return
        if not isinstance(task, InitTask):
            self.trainer.train(task)  # computed, never published
        event("trainer killed mid-step")
        self.faults += 1

    @rule()
    def zombie_trainer_publishes_twice(self):
        task = self.loop.train_task("t0")
        if task is None or isinstance(task, InitTask):
            return
        result = list(self.trainer.train(task))
        assert all(v.accepted for v in self.loop.publish(result, worker_id="t0"))
        assert not any(v.accepted for v in self.loop.publish(result, worker_id="t0"))
        event("duplicate train step rejected")
        self._note()

    # -- rules: the controller -------------------------------------------------------------------

    @rule()
    def restart_controller(self):
        """Kill the controller (nothing in memory survives) and resume from the SQLite file,
        starting from the newest snapshot."""
        self.zombie = self.loop
        self.store = self._open()
        snaps = self.store.snapshots("run")
        head = self.store.head("run").seq
        self.loop = ControllerLoop.resume(self.store, "run", **self._loop_args())
        resumed_from = snaps[0].seq if snaps else 0
        assert self.loop.snapshot_seq in (resumed_from, self.loop.head_seq)  # or it wrote one after ControllerStarted
        assert head - resumed_from < self.snapshot_every  # the fold was only the tail
        if resumed_from:
            event("controller resumed from a snapshot")
        self._note()
        self._join_all()
        event("controller restarted from the ledger")
        self.faults += 1

    @precondition(lambda self: self.zombie is not None)
    @rule()
    def zombie_controller_appends(self):
        head = self.store.head("run").seq
        with pytest.raises(ControllerFenced):
            self.zombie.submit([ev.WorkerJoined("intruder", INFERENCE)])
        assert self.store.head("run").seq == head
        event("zombie controller fenced")

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def check_log(self):
        new = list(self.store.read("run", self.folded_seq + 1))
        written = {s.seq: s for s in self.store.snapshots("run") if s.seq > self.folded_seq}
        for stored in new:
            self.folded = reduce(self.folded, stored.event)
            self.folded_seq = stored.seq
            if stored.seq in self.snapshots:
                assert self.folded == self.snapshots.pop(stored.seq), f"fold differs from the live state at seq {stored.seq}"
            if stored.seq in written:
                at = snapshot.check(self.store, "run", written[stored.seq])
                assert at.state == self.folded, f"snapshot at seq {stored.seq} differs from the fold up to it"
        assert self.folded == self.loop.state
        assert self.loop.snapshot_error is None
        resumed = snapshot.recover(self.store, "run")  # from the newest snapshot, the tail's decisions checked
        assert resumed.seq == self.folded_seq and resumed.state == self.folded
        assert resumed.folded == self.folded_seq - resumed.snapshot_seq < self.snapshot_every
        assert snapshot.encode(resumed.state, resumed.cache) == snapshot.encode(self.loop.state, self.loop.cache)
        violations = check(self.store.read("run"))
        assert not violations, "\n".join(map(str, violations))


def _variant(mode: str, filter_groups: bool):
    machine = type(f"Machine_{mode}_{filter_groups}", (ControllerMachine,), {"MODE": mode, "FILTER": filter_groups})
    case = machine.TestCase
    case.settings = settings(max_examples=EXAMPLES, stateful_step_count=30, deadline=None)
    return case


# One machine per (mode, filtering) so that each gets its share of examples.
TestDeterministic = _variant("deterministic", False)
TestDeterministicFiltered = _variant("deterministic", True)
TestFreshest = _variant("freshest", False)
TestFreshestFiltered = _variant("freshest", True)
