"""What a replay re-runs, read from a run's events: pure, no JAX, no I/O.

A ledger holds everything a train step consumed: ``BatchFormed`` names the rollouts in training
order, ``RolloutRequested`` / ``RolloutCompleted`` / ``OutcomeRecorded`` give their prompts,
tokens, behaviour log-probs and rewards, and ``WeightsPublished`` the digest each step must
reproduce. :func:`plan_replay` gathers these into one :class:`StepPlan` per committed step (the
same ``TrainTask`` the controller handed the trainer) and the accepted completions of every
policy version, for re-sampling.

Parameter versions the run retired before a step's train task became available are listed in
``StepPlan.unavailable``: the trainer falls back to behaviour log-probs for rows of a version it
cannot load, so a replay must not load them either. The task becomes available when the
transaction holding the later of its ``BatchFormed`` and its parent's ``WeightsPublished``
commits; a transaction is a run of inputs followed by the decisions they caused, so it ends
where the run of decision events after that point ends.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from ledger import events as ev
from ledger.store import StoredEvent
from runtime.controller.admit import DECISION_KINDS
from runtime.controller.workers import Lease, TrainRollout, TrainTask
from runtime.errors import RlxError


class IncompleteLedger(RlxError):
    """The ledger lacks an event a step or rollout refers to (the message names it)."""


@dataclasses.dataclass(frozen=True)
class Published:
    """A ``WeightsPublished`` event and its seq."""

    seq: int
    event: ev.WeightsPublished


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """One committed train step: its inputs and the events it must reproduce.

    Attributes:
      task: the train task, rebuilt from the logged batch and rollouts.
      trained_seq: seq of the logged ``TrainStepCompleted``.
      trained: the logged ``TrainStepCompleted``.
      published: the logged ``WeightsPublished`` of version ``step``.
      unavailable: versions retired before the task became available (see module docstring).
    """

    task: TrainTask
    trained_seq: int
    trained: ev.TrainStepCompleted
    published: Published
    unavailable: frozenset[int]

    @property
    def step(self) -> int:
        return self.task.step

    def row_versions(self) -> frozenset[int]:
        """The policy versions the batch's rollouts were sampled from."""
        return frozenset(int(v) for v in self.task.batch.policy_versions)


@dataclasses.dataclass(frozen=True)
class SampledRollout:
    """An accepted completion and what it was sampled from: re-sampling it must give its bits."""

    seq: int
    lease: Lease
    completion: ev.RolloutCompleted


@dataclasses.dataclass(frozen=True)
class ReplayPlan:
    """Everything a replay re-runs, in version order.

    Attributes:
      run: the ``RunStarted`` event (config, seed, fingerprint).
      versions: every published version (0 first).
      steps: committed train steps, ascending (step ``s`` produces version ``s``).
      rollouts: accepted completions by the policy version they were sampled from, by rollout id.
      retained: versions published and never retired (the parameter store must hold them).
    """

    run: ev.RunStarted
    versions: Mapping[int, Published]
    steps: tuple[StepPlan, ...]
    rollouts: Mapping[int, tuple[SampledRollout, ...]]
    retained: tuple[int, ...]

    @property
    def latest(self) -> int:
        """The newest published version (-1 before version 0)."""
        return max(self.versions, default=-1)


def plan_replay(events: Iterable[StoredEvent]) -> ReplayPlan:
    """The :class:`ReplayPlan` of a run's stored events (in seq order).

    Raises:
      IncompleteLedger: no ``RunStarted``, or a batch names a rollout without its request,
        accepted completion or outcome.
    """
    run: ev.RunStarted | None = None
    requests: dict[int, ev.SampleRequest] = {}
    completions: dict[int, tuple[int, ev.RolloutCompleted]] = {}
    outcomes: dict[int, ev.OutcomeRecorded] = {}
    batches: dict[int, tuple[int, ev.BatchFormed]] = {}
    trained: dict[int, tuple[int, ev.TrainStepCompleted]] = {}
    published: dict[int, Published] = {}
    retired_at: dict[int, int] = {}
    decision_run_end: dict[int, int] = {}  # seq -> last seq of the decisions that follow it
    pending: list[int] = []
    for stored in events:
        e, seq = stored.event, stored.seq
        kind = type(e)
        if kind not in DECISION_KINDS:
            for p in pending:
                decision_run_end[p] = pending[-1]
            pending = []
        pending.append(seq)
        if type(e) is ev.RolloutRequested:
            for q in e.samples():
                requests[q.rollout_id] = q
        elif type(e) is ev.RolloutCompleted:
            completions.setdefault(e.rollout_id, (seq, e))
        elif type(e) is ev.OutcomeRecorded:
            outcomes.setdefault(e.rollout_id, e)
        elif type(e) is ev.BatchFormed:
            batches.setdefault(e.step, (seq, e))
        elif type(e) is ev.TrainStepCompleted:
            trained.setdefault(e.step, (seq, e))
        elif type(e) is ev.WeightsPublished:
            published.setdefault(e.version, Published(seq, e))
        elif type(e) is ev.VersionsRetired:
            for v in e.versions:
                retired_at.setdefault(int(v), seq)
        elif type(e) is ev.RunStarted and run is None:
            run = e
    for p in pending:
        decision_run_end[p] = pending[-1]
    if run is None:
        raise IncompleteLedger("the ledger has no RunStarted event: it is not a run")

    steps = []
    for step in sorted(s for s in trained if s in published and s in batches):
        batch_seq, batch = batches[step]
        parent = published.get(step - 1)
        if parent is None:
            raise IncompleteLedger(f"step {step} was trained but its parent version {step - 1} was never published")
        rollouts = tuple(_train_rollout(step, rid, requests, completions, outcomes) for rid in batch.rollout_ids)
        task = TrainTask(step, step - 1, parent.event.digest, batch, rollouts)
        ready = decision_run_end[max(batch_seq, parent.seq)]
        unavailable = frozenset(v for v, at in retired_at.items() if at <= ready)
        steps.append(StepPlan(task, trained[step][0], trained[step][1], published[step], unavailable))

    by_version: dict[int, list[SampledRollout]] = {}
    for rid in sorted(completions):
        seq, c = completions[rid]
        r = requests.get(rid)
        if r is None:
            raise IncompleteLedger(f"rollout {rid} was completed (seq {seq}) but never requested")
        digest = published[r.policy_version].event.digest if r.policy_version in published else c.weights_digest
        lease = Lease(rid, c.attempt, r.group_id, r.batch, r.ordinal, r.prompt_index, r.policy_version,
                      digest, r.seed, r.sampling)
        by_version.setdefault(r.policy_version, []).append(SampledRollout(seq, lease, c))

    retained = tuple(sorted(v for v in published if v not in retired_at))
    return ReplayPlan(
        run,
        dict(sorted(published.items())),
        tuple(steps),
        {v: tuple(rs) for v, rs in sorted(by_version.items())},
        retained,
    )


def _train_rollout(step: int, rid: int, requests, completions, outcomes) -> TrainRollout:
    missing = [name for name, table in (("request", requests), ("completion", completions), ("outcome", outcomes))
               if rid not in table]
    if missing:
        raise IncompleteLedger(f"batch {step} consumes rollout {rid}, which has no logged {' or '.join(missing)}")
    return TrainRollout(requests[rid], completions[rid][1], outcomes[rid])


def replay_start(plan: ReplayPlan, version: int) -> int:
    """The version a replay asked to start at ``version`` re-trains from: the newest version at or
    before it that the run still retains (``params.keep_every`` checkpoints, the newest few)
    together with every older version the steps after it read for their old log-probs; version 0,
    which a replay rebuilds, when none is.
    """
    retained = set(plan.retained)
    for start in sorted((v for v in retained if 0 < v <= version), reverse=True):
        reads = {v for step in plan.steps if step.step > start
                 for v in step.row_versions() - step.unavailable if 0 < v < start}
        if reads <= retained:
            return start
    return 0

