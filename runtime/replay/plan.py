"""What a replay re-runs, read from a run's events in one streaming pass: pure, no JAX, no I/O.

A ledger holds everything a train step consumed: ``BatchFormed`` names the rollouts in training
order, ``RolloutRequested`` / ``RolloutCompleted`` / ``OutcomeRecorded`` give their prompts,
tokens, behaviour log-probs and rewards, and ``WeightsPublished`` the digest each step must
reproduce.

Two passes, each holding memory bounded by what a run keeps live, never by the log's length:

* :func:`index_run` reads what is small — ``RunStarted``, every published version, every
  committed step's seqs and logged events, retirements, the engines workers recorded — into a
  :class:`ReplayIndex` (a few numbers per step and per version).
* :func:`stream_replay` reads the log again and yields, in ledger order, one :class:`StepPlan`
  per committed step (the same ``TrainTask`` the controller handed the trainer, built from the
  controller's own payload cache, which drops a rollout once its step is trained or its group
  discarded) and, on request, every accepted completion of a version as a :class:`Sampled` batch
  once the run retires that version (or at the end), for re-sampling.

:func:`plan_replay` gathers both into a :class:`ReplayPlan` in memory, for small runs and tests.

Parameter versions the run retired before a step's train task became available are unavailable
to it: the trainer falls back to behaviour log-probs for rows of a version it cannot load, so a
replay must not load them either. The task becomes available when the transaction holding the
later of its ``BatchFormed`` and its parent's ``WeightsPublished`` commits; a transaction is a run
of inputs followed by the decisions they caused, so it ends where the run of decision events
after that point ends. A step records how many retirements had happened by then
(``retired_through``), so that which versions it could not read is a lookup, not a set per step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping

from ledger import events as ev
from ledger.store import StoredEvent
from runtime.controller.admit import DECISION_KINDS
from runtime.controller.cache import RolloutCache
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
class Retirements:
    """When each retired version was retired: its position in the run's retirement order."""

    order: Mapping[int, int]

    def by(self, version: int, count: int) -> bool:
        """Whether ``version`` was among the first ``count`` versions the run retired."""
        at = self.order.get(version)
        return at is not None and at < count


@dataclasses.dataclass(frozen=True)
class StepIndex:
    """One committed train step, as the index pass knows it.

    Attributes:
      step: the step (it produces version ``step``).
      batch_seq: seq of its ``BatchFormed``.
      trained_seq: seq of the logged ``TrainStepCompleted``.
      trained: the logged ``TrainStepCompleted``.
      published: the logged ``WeightsPublished`` of version ``step``.
      versions: the policy versions the batch's rollouts were sampled from.
      retired_through: how many versions the run had retired when the task became available.
      retirements: the run's retirement order (shared by every step).
    """

    step: int
    batch_seq: int
    trained_seq: int
    trained: ev.TrainStepCompleted
    published: Published
    versions: frozenset[int]
    retired_through: int
    retirements: Retirements

    def row_versions(self) -> frozenset[int]:
        """The policy versions the batch's rollouts were sampled from."""
        return self.versions

    def could_not_read(self, version: int) -> bool:
        """Whether the run had retired ``version`` before this step's task became available."""
        return self.retirements.by(version, self.retired_through)

    @property
    def unavailable(self) -> frozenset[int]:
        """The batch's versions the run had retired before the task became available."""
        return frozenset(v for v in self.versions if self.could_not_read(v))


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """One committed train step: its inputs and the events it must reproduce."""

    task: TrainTask
    index: StepIndex

    @property
    def step(self) -> int:
        return self.task.step

    @property
    def trained_seq(self) -> int:
        return self.index.trained_seq

    @property
    def trained(self) -> ev.TrainStepCompleted:
        return self.index.trained

    @property
    def published(self) -> Published:
        return self.index.published

    @property
    def unavailable(self) -> frozenset[int]:
        return self.index.unavailable

    def row_versions(self) -> frozenset[int]:
        return self.index.row_versions()

    def could_not_read(self, version: int) -> bool:
        return self.index.could_not_read(version)


@dataclasses.dataclass(frozen=True)
class SampledRollout:
    """An accepted completion and what it was sampled from: re-sampling it must give its bits."""

    seq: int
    lease: Lease
    completion: ev.RolloutCompleted


@dataclasses.dataclass(frozen=True)
class Sampled:
    """Accepted completions of one policy version, by rollout id (a batch to re-sample)."""

    version: int
    rollouts: tuple[SampledRollout, ...]


@dataclasses.dataclass(frozen=True)
class ReplayIndex:
    """What a replay needs to know before re-running anything (see the module docstring).

    Attributes:
      run: the ``RunStarted`` event (config, seed, fingerprint).
      versions: every published version (0 first).
      steps: committed train steps, ascending (step ``s`` produces version ``s``).
      retained: versions published and never retired (the parameter store must hold them).
      engine_shapes: the distinct engine batch shapes inference workers recorded when they joined.
      trainer_layouts: the distinct ``{processes, devices, collectives}`` trainers recorded when
        they joined (a trainer gang's rank 0 records the gang's).
      events: how many events the run has.
      trainer_fingerprint: the stack the first trainer that joined recorded (None before any
        joined): the machine whose bits a replay re-trains.
      forks: each ``RunForked`` with its seq, oldest first (a fork's steps after it train with
        its config: :meth:`config_at`).
    """

    run: ev.RunStarted
    versions: Mapping[int, Published]
    steps: tuple[StepIndex, ...]
    retained: tuple[int, ...]
    engine_shapes: tuple[dict, ...] = ()
    events: int = 0
    trainer_layouts: tuple[dict, ...] = ()
    trainer_fingerprint: dict | None = None
    forks: tuple[tuple[int, ev.RunForked], ...] = ()

    def config_at(self, seq: int) -> dict:
        """The config the run ran with at ``seq``: the newest ``RunForked``'s before it, else
        ``RunStarted``'s."""
        config = self.run.config
        for at, fork in self.forks:
            if at < seq:
                config = fork.config
        return config

    @property
    def latest(self) -> int:
        """The newest published version (-1 before version 0)."""
        return max(self.versions, default=-1)


@dataclasses.dataclass(frozen=True)
class ReplayPlan:
    """Everything a replay re-runs, in version order, in memory (:func:`plan_replay`).

    Attributes:
      run, versions, retained: as in :class:`ReplayIndex`.
      steps: committed train steps, ascending, with their tasks.
      rollouts: accepted completions by the policy version they were sampled from, by rollout id.
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


def index_run(events: Iterable[StoredEvent]) -> ReplayIndex:
    """The :class:`ReplayIndex` of a run's stored events (in seq order), in one pass.

    Raises:
      IncompleteLedger: no ``RunStarted``, or a step was trained whose parent was never published.
    """
    run: ev.RunStarted | None = None
    published: dict[int, Published] = {}
    batches: dict[int, tuple[int, frozenset[int]]] = {}  # step -> (seq, versions), until indexed
    ready: dict[int, int] = {}  # step -> retirements by the time its task became available
    armed: list[int] = []  # steps whose task becomes available when the current transaction ends
    order: dict[int, int] = {}
    trained: dict[int, tuple[int, ev.TrainStepCompleted]] = {}
    shapes: list[dict] = []
    layouts: list[dict] = []
    trainer_fingerprint: dict | None = None
    forks: list[tuple[int, ev.RunForked]] = []
    count = 0
    for stored in events:
        e, seq = stored.event, stored.seq
        count += 1
        if type(e) not in DECISION_KINDS and armed:  # the transaction before this event has ended
            for s in armed:
                ready[s] = len(order)
            armed = []
        if type(e) is ev.BatchFormed:
            if e.step not in batches:
                batches[e.step] = (seq, frozenset(int(v) for v in e.policy_versions))
                if e.step - 1 in published:
                    armed.append(e.step)
        elif type(e) is ev.WeightsPublished:
            if e.version not in published:
                published[e.version] = Published(seq, e)
                if e.version + 1 in batches and e.version + 1 not in ready:
                    armed.append(e.version + 1)
        elif type(e) is ev.TrainStepCompleted:
            trained.setdefault(e.step, (seq, e))
        elif type(e) is ev.VersionsRetired:
            for v in e.versions:
                order.setdefault(int(v), len(order))
        elif type(e) is ev.WorkerJoined:
            shape = _engine_shape(e)
            if shape is not None and shape not in shapes:
                shapes.append(shape)
            layout = _trainer_layout(e)
            if layout is not None and layout not in layouts:
                layouts.append(layout)
            if layout is not None and trainer_fingerprint is None:
                trainer_fingerprint = e.info["fingerprint"]
        elif type(e) is ev.RunStarted and run is None:
            run = e
        elif type(e) is ev.RunForked:
            forks.append((seq, e))
    for s in armed:
        ready[s] = len(order)
    if run is None:
        raise IncompleteLedger("the ledger has no RunStarted event: it is not a run")

    retirements = Retirements(order)
    steps = []
    for step in sorted(s for s in trained if s in published and s in batches):
        if step - 1 not in published:
            raise IncompleteLedger(f"step {step} was trained but its parent version {step - 1} was never published")
        batch_seq, versions = batches[step]
        trained_seq, trained_event = trained[step]
        steps.append(StepIndex(step, batch_seq, trained_seq, trained_event, published[step], versions,
                               ready.get(step, len(order)), retirements))
    retained = tuple(sorted(v for v in published if v not in order))
    return ReplayIndex(run, dict(sorted(published.items())), tuple(steps), retained, tuple(shapes), count,
                       tuple(layouts), trainer_fingerprint, tuple(forks))


def _trainer_layout(e: ev.WorkerJoined) -> dict | None:
    fingerprint = e.info.get("fingerprint")
    if e.role != "trainer" or not isinstance(fingerprint, dict) or "devices" not in fingerprint:
        return None
    return {"processes": fingerprint.get("processes", 1), "devices": fingerprint["devices"],
            "collectives": fingerprint.get("collectives")}


def _engine_shape(e: ev.WorkerJoined) -> dict | None:
    if e.role != "inference" or not isinstance(e.info.get("engine"), dict):
        return None
    return {k: list(v) if isinstance(v, tuple) else v for k, v in e.info["engine"].items()}


def stream_replay(events: Iterable[StoredEvent], index: ReplayIndex, *, start: int = 0,
                  sampled: bool = False) -> Iterator[StepPlan | Sampled]:
    """The committed steps after version ``start`` as :class:`StepPlan` items, each at its
    ``TrainStepCompleted`` and so in step order; with ``sampled``, also the accepted completions
    of every version from ``start`` on as :class:`Sampled` items, each version's once the run
    retires it or the log ends (before any later step could delete it).

    Memory is bounded by the work the run had in flight (see the module docstring).

    Raises:
      IncompleteLedger: a batch names a rollout without its request, accepted completion or
        outcome, or a completion has no request.
    """
    steps = {s.step: s for s in index.steps if s.step > start}
    cache = RolloutCache()
    pending: dict[int, list[SampledRollout]] = {}
    seen: set[int] = set()  # rollouts with an accepted completion, while their version is pending
    for stored in events:
        e = stored.event
        if type(e) is ev.TrainStepCompleted and e.step in steps:
            yield _step_plan(steps.pop(e.step), cache, index)
        elif sampled and type(e) is ev.RolloutCompleted:
            r = cache.requests.get(e.rollout_id)
            if r is None:
                raise IncompleteLedger(f"rollout {e.rollout_id} was completed (seq {stored.seq}) but never requested")
            if r.policy_version >= start and e.rollout_id not in seen:
                seen.add(e.rollout_id)
                pub = index.versions.get(r.policy_version)
                digest = pub.event.digest if pub is not None else e.weights_digest
                lease = Lease(e.rollout_id, e.attempt, r.group_id, r.batch, r.ordinal, r.prompt_index,
                              r.policy_version, digest, r.seed, r.sampling)
                pending.setdefault(r.policy_version, []).append(SampledRollout(stored.seq, lease, e))
        elif sampled and type(e) is ev.VersionsRetired:
            for v in sorted(int(v) for v in e.versions):
                if v in pending:
                    yield _sampled(v, pending.pop(v), seen)
        cache.observe(e)
    for v in sorted(pending):
        yield _sampled(v, pending[v], seen)


def _sampled(version: int, rollouts: list[SampledRollout], seen: set[int]) -> Sampled:
    seen.difference_update(r.lease.rollout_id for r in rollouts)
    return Sampled(version, tuple(sorted(rollouts, key=lambda r: r.lease.rollout_id)))


def _step_plan(step: StepIndex, cache: RolloutCache, index: ReplayIndex) -> StepPlan:
    batch = cache.batches.get(step.step)
    if batch is None:
        raise IncompleteLedger(f"step {step.step} was trained but its BatchFormed left no batch to train")
    rollouts = []
    for rid in batch.rollout_ids:
        missing = [name for name, table in (("request", cache.requests), ("completion", cache.completions),
                                            ("outcome", cache.outcomes)) if rid not in table]
        if missing:
            raise IncompleteLedger(f"batch {step.step} consumes rollout {rid}, which has no logged "
                                   f"{' or '.join(missing)}")
        rollouts.append(TrainRollout(cache.requests[rid], cache.completions[rid], cache.outcomes[rid]))
    parent = index.versions[step.step - 1]
    return StepPlan(TrainTask(step.step, step.step - 1, parent.event.digest, batch, tuple(rollouts)), step)


def plan_replay(events: Iterable[StoredEvent]) -> ReplayPlan:
    """The whole :class:`ReplayPlan` of a run's stored events (in seq order), in memory.

    Raises:
      IncompleteLedger: as :func:`index_run` and :func:`stream_replay`.
    """
    events = list(events)
    index = index_run(events)
    steps: list[StepPlan] = []
    rollouts: dict[int, tuple[SampledRollout, ...]] = {}
    for item in stream_replay(events, index, sampled=True):
        if isinstance(item, StepPlan):
            steps.append(item)
        else:
            rollouts[item.version] = item.rollouts
    return ReplayPlan(index.run, index.versions, tuple(steps), dict(sorted(rollouts.items())), index.retained)


def replay_start(plan: ReplayIndex | ReplayPlan, version: int) -> int:
    """The version a replay asked to start at ``version`` re-trains from: the newest version at or
    before it that the run still retains (``params.keep_every`` checkpoints, the newest few)
    together with every older version the steps after it read for their old log-probs; version 0,
    which a replay rebuilds, when none is.
    """
    retained = set(plan.retained)
    for start in sorted((v for v in retained if 0 < v <= version), reverse=True):
        reads = {v for step in plan.steps if step.step > start
                 for v in step.row_versions() if 0 < v < start and not step.could_not_read(v)}
        if reads <= retained:
            return start
    return 0
