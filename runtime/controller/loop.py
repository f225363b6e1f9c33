"""The controller's I/O shell: the single writer of a run's ledger.

Every call that brings news from outside (a worker joined or left, completions, outcomes, a
train step, an observed lease expiry) goes through :meth:`ControllerLoop.submit`:

1. each input is checked by ``admit`` against the state folded so far; rejected ones get a
   :class:`Verdict` with the reason and are not written (I4);
2. ``decide`` runs on the state after the admitted inputs;
3. inputs and decisions are appended in **one** transaction, at the expected head and under the
   loop's writer epoch. A newer controller has fenced this one if that raises ``Fenced`` (or
   ``AppendConflict``): the loop then refuses every further call, and nothing was written.

Only after the append does the in-memory state advance, so the state is always the fold of the
committed ledger. The clock is read here and nowhere else: :meth:`expire` turns leases and
workers that have been silent for ``lease_timeout_s`` into ``RolloutAbandoned`` and
``WorkerLost`` inputs. Verification and training are leased in memory only (re-running them is
harmless: both are pure and their results are admitted once).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence

from ledger import events as ev
from ledger.errors import AppendConflict, Fenced, LedgerError
from ledger.store import EventStore, Head
from runtime.controller import snapshot
from runtime.controller.admit import publication
from runtime.controller.cache import RolloutCache
from runtime.controller.decide import decide_and_fold
from runtime.controller.reduce import Folder
from runtime.controller.state import INITIAL, ControllerState
from runtime.controller.workers import (
    ACCEPTED,
    ROLES,
    InitTask,
    Lease,
    ScoreTask,
    TrainRollout,
    TrainTask,
    Verdict,
)
from runtime.errors import RlxError, UsageError
from runtime.failpoints import failpoint

Clock = Callable[[], float]
ADVANCING = frozenset({ev.RolloutCompleted, ev.OutcomeRecorded, ev.TrainStepCompleted, ev.WeightsPublished,
                       ev.VersionEvaluated})
"""Inputs that move a run on (joins, losses and abandoned leases do not)."""


class ControllerFenced(RlxError):
    """This controller lost the writer epoch to a newer one; it must stop."""


class ControllerLoop:
    """Admits inputs, decides, appends; answers workers' pulls. Thread-safe.

    Create with :meth:`create` (a new run) or :meth:`resume` (an existing one).

    Args:
        on_retire: called with the versions of each committed ``VersionsRetired`` (e.g. to
            delete them from the parameter store); a crash before it runs is repaired by
            :meth:`evictable_versions` after a resume.
        clock: seconds, monotonic; used for lease expiry only.
        lease_timeout_s: silence after which a worker is lost and a lease is given up.
        on_commit: called with the events of each append (inputs and decisions, in ledger order)
            after the state has advanced, under the loop's lock: it must only queue work (the
            held-out evaluator and the metrics log of ``rlx run`` listen here).
        snapshot_every: after an append that brings the head this many events past the last
            snapshot, write one (``runtime.controller.snapshot``); 0 never writes any.
        warn: hears one line when a snapshot write fails after a good one (or the first write
            fails), and one when a write succeeds again; failures in between are not repeated.
    """

    def __init__(self, store: EventStore, run_id: str, epoch: int, *, clock: Clock = time.monotonic,
                 lease_timeout_s: float = 120.0, on_retire: Callable[[tuple[int, ...]], None] | None = None,
                 snapshot_every: int = 0, on_commit: Callable[[list[ev.Event]], None] | None = None,
                 warn: snapshot.Warn | None = None):
        self.store = store
        self.run_id = run_id
        self.epoch = epoch
        self.clock = clock
        self.lease_timeout_s = float(lease_timeout_s)
        self.on_retire = on_retire
        self.on_commit = on_commit
        self.snapshot_every = int(snapshot_every)
        self.snapshot_seq = 0  # seq of the newest snapshot written or resumed from
        self.snapshot_error: str | None = None  # why the last snapshot write failed, if it did
        self.snapshot_failures = 0  # failed snapshot writes since the last good one
        self.warn = warn
        self.cache = RolloutCache()
        self.head_seq = 0
        self.rejected = 0
        self._state = INITIAL
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)  # notified after every append
        self._fenced: str | None = None
        self._seen: dict[str, float] = {}  # worker id -> last call
        self._held: dict[str, dict[int, None]] = {}  # worker id -> rollout ids leased to it (lazily pruned)
        self._leased_at: dict[int, float] = {}  # rollout id -> time of its current lease
        self._scoring: dict[int, tuple[float, str]] = {}  # rollout id -> when and to whom handed out for scoring
        self._training: dict[int, tuple[float, str]] = {}  # step -> when and to whom handed out for training
        self.completed_tokens = 0  # tokens of the accepted completions this controller appended
        self.advanced = 0  # accepted inputs that moved the run on (see ADVANCING), for the host's stall watch
        self.last_metrics: dict = {}  # metrics of the newest TrainStepCompleted it appended

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def create(cls, store: EventStore, *, run_id: str, config: dict, config_digest: str, seed: int,
               fingerprint: dict | None = None, **kwargs) -> ControllerLoop:
        """Start a new run: create it in ``store``, take epoch 1, append ``RunStarted``."""
        store.create_run(run_id)
        loop = cls(store, run_id, store.acquire_epoch(run_id), **kwargs)
        started = ev.RunStarted(run_id, config, config_digest, int(seed), dict(fingerprint or {}))
        verdicts = loop.submit([started, ev.ControllerStarted(loop.epoch, 0, dict(fingerprint or {}))])
        if not all(v.accepted for v in verdicts):
            raise UsageError(f"cannot start run {run_id!r}: {[v.reason for v in verdicts if not v.accepted]}")
        return loop

    @classmethod
    def resume(cls, store: EventStore, run_id: str, *, check: bool = True, fingerprint: dict | None = None,
               start: snapshot.Recovered | None = None, snapshots: bool = True,
               warn: snapshot.Warn | None = None, **kwargs) -> ControllerLoop:
        """Continue a run: take a new writer epoch (fencing any older controller), fold the
        ledger (checking every decision when ``check``), append ``ControllerStarted``.

        The fold continues ``start`` (a fold made before the epoch was taken, which this loop
        takes over) or starts from the newest usable snapshot (with ``snapshots``; ``warn`` hears
        of skipped ones, and of failed snapshot writes later) or from seq 1; the tail is
        chain-checked as it is folded.

        Every lease of the previous controller is given back by ``ControllerStarted``; workers
        join again and the requests are leased anew.
        """
        loop = cls(store, run_id, store.acquire_epoch(run_id), warn=warn, **kwargs)
        rec = snapshot.recover(store, run_id, start=start, snapshots=snapshots, check=check, warn=warn)
        loop._state, loop.cache, loop.head_seq = rec.state, rec.cache, rec.seq
        loop.snapshot_seq = rec.snapshot_seq
        loop.submit([ev.ControllerStarted(loop.epoch, loop.head_seq, dict(fingerprint or {}),
                                          rec.snapshot_seq, rec.snapshot_digest)])
        return loop

    @classmethod
    def continue_with(cls, store: EventStore, run_id: str, start: snapshot.Recovered, inputs: Sequence[ev.Event],
                      **kwargs) -> ControllerLoop:
        """Append ``inputs`` and the decisions they call for after ``start``, the fold of the
        run's whole log, under a writer epoch above every epoch that log names: how a fork
        (``runtime.fork``) records its parent and settings after the history it copied.

        Raises:
            UsageError: an input is not admitted.
        """
        epoch = store.acquire_epoch(run_id)
        while epoch <= start.state.epoch:  # the copied history's controllers had these epochs
            epoch = store.acquire_epoch(run_id)
        loop = cls(store, run_id, epoch, **kwargs)
        loop._state, loop.cache, loop.head_seq = start.state, start.cache, start.seq
        verdicts = loop.submit(inputs)
        if not all(v.accepted for v in verdicts):
            raise UsageError(f"cannot continue run {run_id!r}: {[v.reason for v in verdicts if not v.accepted]}")
        return loop

    # -- core -----------------------------------------------------------------------------------

    @property
    def state(self) -> ControllerState:
        """The fold of the committed ledger."""
        return self._state

    @property
    def finished(self) -> bool:
        return self._state.finished

    def submit(self, inputs: Sequence[ev.Event], *, whole: bool = False) -> list[Verdict]:
        """Admit ``inputs``, decide, and append both in one transaction (see module docstring).
        ``whole``: the inputs are admitted together or not at all (a train step and its weights)."""
        with self._lock:
            if self._fenced:
                raise ControllerFenced(self._fenced)
            folder = Folder(self._state)  # admit reads the fold so far
            accepted: list[ev.Event] = []
            verdicts: list[Verdict] = []
            for e in inputs:
                reason = folder.admit(e)
                if reason is None:
                    accepted.append(e)
                    verdicts.append(ACCEPTED)
                else:
                    self.rejected += 1
                    verdicts.append(Verdict(False, reason))
            if whole and len(accepted) < len(inputs):
                why = "; ".join(v.reason or "rejected" for v in verdicts if not v.accepted)
                self.rejected += len(accepted)
                return [v if not v.accepted else Verdict(False, f"not admitted without the rest of its submission: {why}")
                        for v in verdicts]
            if not accepted:
                return verdicts
            decisions, state = decide_and_fold(folder.state())
            batch = accepted + decisions
            try:
                head = self.store.append(self.run_id, batch, expected_seq=self.head_seq, epoch=self.epoch)
            except (Fenced, AppendConflict) as e:
                self._fenced = f"controller of run {self.run_id!r} at epoch {self.epoch} is fenced: {e}"
                raise ControllerFenced(self._fenced) from e
            self._state = state
            self.head_seq = head.seq
            self.advanced += sum(1 for e in accepted if type(e) in ADVANCING)
            now = self.clock()
            observe = self.cache.observe
            for event in batch:
                if type(event) is ev.RolloutAssigned:
                    held, leased_at = self._held.setdefault(event.worker_id, {}), self._leased_at
                    for rid in event.rollout_ids:
                        held[rid] = None
                        leased_at[rid] = now
                    continue
                observe(event)
                if type(event) is ev.RolloutCompleted:
                    self.completed_tokens += len(event.tokens)
                elif type(event) is ev.VersionsRetired and self.on_retire is not None:
                    self.on_retire(tuple(event.versions))
                elif type(event) is ev.WorkerLost:
                    self._release(event.worker_id)
                elif type(event) is ev.TrainStepCompleted:
                    self.last_metrics = dict(event.metrics)
            if self.on_commit is not None:
                self.on_commit(batch)
            if self.snapshot_every > 0 and self.head_seq - self.snapshot_seq >= self.snapshot_every:
                self._snapshot(head.digest)
            self._changed.notify_all()
            return verdicts

    def _snapshot(self, digest: bytes) -> None:
        """Write a snapshot of the head's fold and commit to it in the log (``snapshot.commit``:
        the row, then its ``SnapshotTaken``, which changes no state and moves the head by one). A
        failed write (a ledger or I/O error) is remembered in ``snapshot_error``, told to ``warn``
        if the previous write was good, and the run goes on: snapshots only shorten a later
        resume. The next one is tried ``snapshot_every`` events later. Fenced meanwhile, the loop
        refuses its next call (this one's inputs are committed)."""
        self.snapshot_seq = self.head_seq
        try:
            _, head = snapshot.commit(self.store, self.run_id, Head(self.head_seq, digest), self.epoch, self._state,
                                      self.cache, before_commit=lambda: failpoint("ledger.snapshot"))
            self.head_seq = self.snapshot_seq = head.seq
        except (Fenced, AppendConflict) as e:
            self._fenced = f"controller of run {self.run_id!r} at epoch {self.epoch} is fenced: {e}"
            return
        except (LedgerError, OSError) as e:
            self.snapshot_error = f"snapshot of run {self.run_id!r} at seq {self.head_seq} not written: {e}"
            self.snapshot_failures += 1
            if self.snapshot_failures == 1 and self.warn is not None:
                self.warn(f"warning: {self.snapshot_error}; the run goes on (a resume folds from an older "
                          "snapshot), and later failures are not repeated until a write succeeds")
            return
        if self.snapshot_failures and self.warn is not None:
            self.warn(f"snapshots of run {self.run_id!r} are written again (seq {self.head_seq}, after "
                      f"{self.snapshot_failures} failed write{'s' if self.snapshot_failures > 1 else ''})")
        self.snapshot_error, self.snapshot_failures = None, 0

    def _release(self, worker_id: str) -> None:
        """Give back what was handed out to a lost worker: its scoring and training hand-outs
        (its leases go back in the fold)."""
        self._held.pop(worker_id, None)
        self._seen.pop(worker_id, None)
        for table in (self._scoring, self._training):
            for key in [k for k, (_, holder) in table.items() if holder == worker_id]:
                del table[key]

    def wait_for_change(self, seq: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for an append after ledger head ``seq``; True if one came."""
        with self._changed:
            if self.head_seq == seq and not self._fenced:
                self._changed.wait(max(0.0, timeout))
            return self.head_seq != seq

    def exclusive(self) -> threading.RLock:
        """The loop's lock, for a caller whose calls must follow each other with no worker's call
        in between (a host heartbeating for its worker threads just before the expiry)."""
        return self._lock

    @property
    def fenced(self) -> str | None:
        """Why this controller may no longer write (a newer one took the epoch), or None."""
        return self._fenced

    def check_fenced(self) -> None:
        """Raise ``ControllerFenced`` if a newer controller took the writer epoch, even before
        this one tries to append (a controller that was paused learns it here)."""
        with self._lock:
            if not self._fenced:
                newest = self.store.writer_epoch(self.run_id)
                if newest > self.epoch:
                    self._fenced = f"controller of run {self.run_id!r} at epoch {self.epoch} is fenced by epoch {newest}"
                    self._changed.notify_all()
            if self._fenced:
                raise ControllerFenced(self._fenced)

    # -- workers --------------------------------------------------------------------------------

    def _one(self, event: ev.Event) -> Verdict:
        return self.submit([event])[0]

    def join(self, worker_id: str, role: str, *, slots: int = 1, info: dict | None = None) -> Verdict:
        """Register a worker (again, after a controller restart or its own)."""
        if role not in ROLES:
            raise UsageError(f"worker role {role!r} is not accepted; accepted: {', '.join(ROLES)}")
        with self._lock:
            self._seen[worker_id] = self.clock()
            return self._one(ev.WorkerJoined(worker_id, role, dict(info or {}), int(slots)))

    def leave(self, worker_id: str, reason: str = "shutdown") -> Verdict:
        return self._one(ev.WorkerLost(worker_id, reason))

    def heartbeat(self, worker_id: str, *, rollouts: Iterable[int] = (), steps: Iterable[int] = ()) -> None:
        """The worker is alive and still working on ``rollouts`` (leased to it, or handed to it
        for scoring) and ``steps`` (handed to it for training): their lease periods start again,
        so work longer than the lease timeout is not given to another worker while it runs."""
        with self._lock:
            now = self._seen[worker_id] = self.clock()
            held = self._held.get(worker_id, {})
            for rid in rollouts:
                if rid in held:
                    self._leased_at[rid] = now
                if self._scoring.get(rid, (0.0, None))[1] == worker_id:
                    self._scoring[rid] = (now, worker_id)
            for step in steps:
                if self._training.get(step, (0.0, None))[1] == worker_id:
                    self._training[step] = (now, worker_id)

    def joined(self, worker_id: str) -> bool:
        """Whether ``worker_id`` is joined (a lost worker must join again, under a new id)."""
        return worker_id in self._state.workers

    def lose(self, worker_ids: Iterable[str], reason: str) -> list[Verdict]:
        """Record that these workers are gone (e.g. their process died): their leases and
        hand-outs go back at once, without waiting for the lease timeout. Unjoined ids are skipped."""
        with self._lock:
            workers = self._state.workers
            lost = [ev.WorkerLost(wid, reason) for wid in sorted(set(worker_ids)) if wid in workers]
            return self.submit(lost) if lost else []

    def leases(self, worker_id: str) -> list[Lease]:
        """The worker's current leases (also a heartbeat). Empty if it is not joined."""
        with self._lock:
            self._seen[worker_id] = self.clock()
            s = self._state
            held = self._held.get(worker_id)
            if not held:
                return []
            out = []
            live, payloads, versions = s.requests, self.cache.requests, s.versions
            for rid in list(held):
                r = live.get(rid)
                if r is None or r.holder != worker_id:
                    del held[rid]
                    continue
                q = payloads[rid]
                out.append(Lease(rid, r.attempts - 1, q.group_id, q.batch, q.ordinal, q.prompt_index,
                                 q.policy_version, versions[q.policy_version], q.seed, q.sampling))
            return out

    def complete(self, completions: Sequence[ev.RolloutCompleted]) -> list[Verdict]:
        return self.submit(completions)

    def scoring_work(self, worker_id: str, limit: int) -> list[ScoreTask]:
        """Up to ``limit`` completed, unscored rollouts not handed out in the last lease period."""
        with self._lock:
            now = self.clock()
            self._seen[worker_id] = now
            out: list[ScoreTask] = []
            handed, cutoff = self._scoring, now - self.lease_timeout_s
            requests, completions = self.cache.requests, self.cache.completions
            never = (cutoff, "")
            mine = (now, worker_id)
            for rid in self.cache.unscored:
                if len(out) >= limit:
                    break
                if handed.get(rid, never)[0] > cutoff:  # handed out within the lease period
                    continue
                handed[rid] = mine
                out.append(ScoreTask(rid, requests[rid].prompt_index, completions[rid]))
            return out

    def record_outcomes(self, outcomes: Sequence[ev.OutcomeRecorded]) -> list[Verdict]:
        verdicts = self.submit(outcomes)
        with self._lock:
            handed = self._scoring
            for o in outcomes:
                handed.pop(o.rollout_id, None)
        return verdicts

    def train_task(self, worker_id: str) -> TrainTask | InitTask | None:
        """Version 0 to publish, the next step to train, or None (nothing ready or handed out)."""
        with self._lock:
            now = self.clock()
            self._seen[worker_id] = now
            s = self._state
            if s.spec is None or s.finished:
                return None
            if s.latest < 0:
                step = 0
            elif s.trained < s.formed and s.latest == s.trained:
                step = s.trained + 1
            else:
                return None
            if now - self._training.get(step, (-float("inf"), ""))[0] < self.lease_timeout_s:
                return None
            self._training[step] = (now, worker_id)
            if step == 0:
                return InitTask()
            batch = self.cache.batches[step]
            c = self.cache
            rollouts = tuple(TrainRollout(c.requests[r], c.completions[r], c.outcomes[r]) for r in batch.rollout_ids)
            return TrainTask(step, step - 1, s.versions[step - 1], batch, rollouts)

    def publish(self, events: Sequence[ev.TrainStepCompleted | ev.WeightsPublished], *,
                worker_id: str) -> list[Verdict]:
        """Submit a train step's ``TrainStepCompleted`` + ``WeightsPublished`` (or version 0) from
        ``worker_id``: admitted together, and only while :meth:`train_task` has the step handed
        to that worker (a step completed alone, or by anyone else, would stall the run)."""
        with self._lock:
            problem = publication(events)
            if problem is None:
                step = events[-1].version  # type: ignore[union-attr]
                holder = self._training.get(step, (0.0, None))[1]
                if holder != worker_id:
                    problem = (f"step {step} is not handed to {worker_id!r} for training"
                               + ("" if holder is None else f" (it is handed to {holder!r})"))
            if problem is not None:
                self.rejected += len(events)
                return [Verdict(False, problem) for _ in events]
            self._training.pop(step, None)  # accepted, or back to the queue
            return self.submit(events, whole=True)

    def waiting_for(self) -> str:
        """What the run waits for, in words: the host tells it when the run has made no progress
        for a while (``workers.no_progress_s``)."""
        with self._lock:
            s = self._state
            if s.spec is None:
                return "RunStarted"
            if 0 <= s.latest < s.trained:  # a ledger written before steps were admitted with their weights
                return (f"WeightsPublished {s.trained}, which no trainer is asked for: step {s.trained} was "
                        f"completed without its weights (latest version {s.latest}); the run cannot go on")
            if s.latest < 0 or (s.trained < s.formed and s.latest == s.trained):
                step = 0 if s.latest < 0 else s.trained + 1
                holder = self._training.get(step, (0.0, None))[1]
                what = ("version 0 (WeightsPublished)" if step == 0
                        else f"train step {step} (TrainStepCompleted and WeightsPublished)")
                what += " from a trainer, " + (f"handed to {holder!r}" if holder else "handed to none")
            else:
                queued = leased = unscored = 0
                for r in s.requests.values():
                    if r.done:
                        unscored += r.reward is None
                    elif r.holder is None:
                        queued += 1
                    else:
                        leased += 1
                what = (f"the rollouts of batch {s.formed + 1}: {leased} leased to inference workers, {queued} "
                        f"waiting for a lease, {unscored} completed and waiting for a verifier")
            joined = {w.role for w in s.workers.values()}
            missing = [role for role in ROLES if role not in joined]
            if missing:
                what += f"; no {' or '.join(missing)} worker is joined"
            return what

    # -- time -----------------------------------------------------------------------------------

    def expire(self) -> list[Verdict]:
        """Turn silence into events: workers silent for the lease timeout are lost (their leases
        go back to the queue); leases older than the timeout are abandoned."""
        with self._lock:
            now = self.clock()
            s = self._state
            inputs: list[ev.Event] = []
            lost = set()
            for wid in sorted(s.workers.keys()):
                if now - self._seen.get(wid, now) >= self.lease_timeout_s:
                    inputs.append(ev.WorkerLost(wid, "heartbeat timeout"))
                    lost.add(wid)
            for r in sorted(s.requests.values()):
                if r.holder is None or r.holder in lost:
                    continue
                if now - self._leased_at.get(r.rollout_id, now) >= self.lease_timeout_s:
                    inputs.append(ev.RolloutAbandoned(r.rollout_id, r.attempts - 1, "lease expired"))
            return self.submit(inputs) if inputs else []

    def evictable_versions(self, stored: Iterable[int]) -> tuple[int, ...]:
        """Of the versions in the parameter store, those the run has retired (to delete after a
        resume; versions above the newest published one may be a put in progress and are kept)."""
        s = self._state
        return tuple(sorted(v for v in stored if v <= s.latest and v not in s.versions))
