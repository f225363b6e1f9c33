"""``reduce(state, event) -> state``: the controller's fold over the ledger.

Pure and strict: an event that cannot follow the state (a second completion of a request, a
lease of a request that is not pending, a version out of order) raises :class:`InvalidEvent`,
because the I/O loop admits only inputs that apply and ``decide`` only emits decisions that
apply. An input is checked by ``admit.guard``, the same check the loop admits it with, so a
ledger holds an input exactly when the fold accepts it; a decision is checked by its handler. A
ledger that folds without error is a history the controller could have written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from immutables import MapMutation

from ledger import events as ev
from runtime.controller.admit import INPUT_KINDS, admit, guard
from runtime.controller.spec import DETERMINISTIC, ControllerSpec
from runtime.controller.state import (
    INITIAL,
    ControllerState,
    Group,
    Plan,
    Request,
    Worker,
    insert_sorted,
    remove_sorted,
)
from runtime.errors import RlxError


class InvalidEvent(RlxError):
    """An event that cannot follow the state it is applied to."""


def _invalid(e: ev.Event, why: str) -> InvalidEvent:
    return InvalidEvent(f"{e.KIND} {why}")


_MAPS = ("versions", "requests", "groups", "plans", "workers", "version_refs", "group_versions")
_INDEX = {name: i for i, name in enumerate(ControllerState._fields)}


class _Draft:
    """A mutable working copy of a state for folding a run of events (a *transient*).

    Plain fields are attributes; the persistent maps are ``MapMutation``s, which update in place
    instead of copying a path per update. ``finish`` returns the immutable state; the state the
    draft started from is never changed. Handlers check an event fully before they change the
    draft, and a draft whose event raised is dropped.
    """

    __slots__ = ControllerState._fields

    # ControllerState's fields, as ``__init__`` sets them (annotations only: no class values).
    spec: ControllerSpec | None
    run_id: str
    config_digest: str
    epoch: int
    finished: bool
    next_rollout_id: int
    next_group_id: int
    position: int
    requested: int
    label: tuple[int, int]
    formed: int
    trained: int
    latest: int
    versions: MapMutation[int, str]
    requests: MapMutation[int, Request]
    groups: MapMutation[int, Group]
    plans: MapMutation[int, Plan]
    ready: tuple[int, ...]
    pending: tuple[int, ...]
    workers: MapMutation[str, Worker]
    free: tuple[tuple[int, str], ...]
    joins: int
    version_refs: MapMutation[int, int]
    group_versions: MapMutation[int, int]
    discards: int
    due_evaluations: tuple[tuple[int, str], ...]

    def __init__(self, state: ControllerState) -> None:
        for name, value in zip(ControllerState._fields, state, strict=False):
            setattr(self, name, value)
        for name in _MAPS:
            setattr(self, name, getattr(state, name).mutate())

    def finish(self) -> ControllerState:
        """The state folded so far (the draft stays usable)."""
        values = [getattr(self, name) for name in ControllerState._fields]
        for name in _MAPS:
            values[_INDEX[name]] = self.frozen(name)
        return ControllerState(*values)

    def frozen(self, name: str):
        """The current value of map ``name`` as an iterable ``Map`` (the draft keeps going)."""
        value = getattr(self, name).finish()
        setattr(self, name, value.mutate())
        return value


def _bump(counts, key: int, delta: int) -> None:
    """``counts[key] += delta`` in a ``MapMutation``; keys that reach zero are removed."""
    n = counts.get(key, 0) + delta
    if n:
        counts[key] = n
    else:
        del counts[key]


def _started(d: _Draft, e: ev.Event) -> ControllerSpec:
    if d.spec is None:
        raise _invalid(e, "before RunStarted")
    return d.spec


def _live(d: _Draft, e: ev.Event, rollout_id: int) -> Request:
    r = d.requests.get(rollout_id)
    if r is None:
        raise _invalid(e, f"for rollout {rollout_id}, which is not a live request")
    return r


def _release(d: _Draft, r: Request) -> None:
    """Free the slot of ``r``'s lease holder (if it is still joined)."""
    w = None if r.holder is None else d.workers.get(r.holder)
    if w is None:
        return
    if w.active >= w.slots:
        d.free = insert_sorted(d.free, (w.order, w.worker_id))
    d.workers[w.worker_id] = w.evolve(active=w.active - 1)


def _requeue_leases(d: _Draft, holder: Callable[[str], bool]) -> None:
    """Give back every lease whose holder matches; the requests become pending again."""
    for r in d.frozen("requests").values():
        if r.holder is not None and holder(r.holder):
            d.requests[r.rollout_id] = r.evolve(holder=None)
            d.pending = insert_sorted(d.pending, r.rollout_id)


# The handlers of input kinds run after ``admit.guard`` accepted the event.


def _run_started(d: _Draft, e: ev.RunStarted) -> None:
    d.spec = ControllerSpec.from_config(e.config, e.seed)
    d.run_id, d.config_digest = e.run_id, e.config_digest


def _run_forked(d: _Draft, e: ev.RunForked) -> None:
    # The fork's settings hold from here on; the parent's leases and workers stay with the parent.
    spec = _started(d, e)
    d.spec = ControllerSpec.from_config(e.config, spec.seed)
    d.config_digest = e.config_digest
    _requeue_leases(d, lambda _: True)
    d.workers, d.free = INITIAL.workers.mutate(), ()


def _controller_started(d: _Draft, e: ev.ControllerStarted) -> None:
    # Leases and worker registrations belong to the previous controller: workers join again.
    _requeue_leases(d, lambda _: True)
    d.epoch, d.workers, d.free = e.epoch, INITIAL.workers.mutate(), ()


def _snapshot_taken(d: _Draft, e: ev.SnapshotTaken) -> None:
    pass  # a snapshot of the fold was stored: nothing of the fold changes


def _worker_joined(d: _Draft, e: ev.WorkerJoined) -> None:
    w = Worker(e.worker_id, e.role, e.slots, d.joins)
    if e.role == "inference":
        d.free = insert_sorted(d.free, (w.order, w.worker_id))
    d.workers[w.worker_id] = w
    d.joins += 1


def _worker_lost(d: _Draft, e: ev.WorkerLost) -> None:
    w = d.workers[e.worker_id]
    _requeue_leases(d, lambda holder: holder == e.worker_id)
    del d.workers[w.worker_id]
    d.free = remove_sorted(d.free, (w.order, w.worker_id))


def _prompts_sampled(d: _Draft, e: ev.PromptsSampled) -> None:
    _started(d, e)
    if e.position < 0:
        return
    if e.position != d.position:
        raise _invalid(e, f"at stream position {e.position}; the stream is at {d.position}")
    d.position += len(e.prompt_indices)


def _rollout_requested(d: _Draft, e: ev.RolloutRequested) -> None:
    spec = _started(d, e)
    ids, n, first = e.rollout_ids, len(e.rollout_ids), d.next_rollout_id
    if n == 0 or len(e.seeds) != n or tuple(ids) != tuple(range(first, first + n)):
        raise _invalid(e, f"for rollouts {tuple(ids)} with {len(e.seeds)} seeds; the next rollout id is {first}")
    if e.policy_version not in d.versions:
        raise _invalid(e, f"from version {e.policy_version}, which is not a published, retained version")
    gid = e.group_id
    if gid == d.next_group_id:
        if n > spec.group_size:
            raise _invalid(e, f"requests {n} samples; groups have {spec.group_size}")
        g = Group(gid, e.batch, e.ordinal, e.prompt_index, e.policy_version, tuple(ids))
        if spec.mode == DETERMINISTIC:
            plan = d.plans.get(e.batch) or Plan(e.batch, e.policy_version)
            if e.ordinal != len(plan.groups):
                raise _invalid(e, f"with ordinal {e.ordinal}; batch {e.batch} has {len(plan.groups)} groups")
            d.plans[e.batch] = plan.evolve(groups=plan.groups + (gid,))
            d.requested = max(d.requested, e.batch)
        else:
            if (e.batch, e.ordinal) != d.label:
                raise _invalid(e, f"labelled {(e.batch, e.ordinal)}; the next label is {d.label}")
            nxt = e.ordinal + 1
            d.label = (e.batch + 1, 0) if nxt == spec.groups_per_batch else (e.batch, nxt)
        d.next_group_id = gid + 1
        _bump(d.group_versions, e.policy_version, 1)
    else:  # more samples of the open group (a group may span events)
        prev = d.groups.get(gid)
        if prev is None or gid != d.next_group_id - 1 or len(prev.rollout_ids) + n > spec.group_size:
            raise _invalid(e, f"adds {n} samples to group {gid}, which is not the open group or has no room")
        if (prev.batch, prev.ordinal, prev.prompt_index, prev.policy_version) != (e.batch, e.ordinal, e.prompt_index, e.policy_version):
            raise _invalid(e, f"differs from its group {gid} in batch, ordinal, prompt or version")
        g = prev.evolve(rollout_ids=prev.rollout_ids + tuple(ids))
    d.next_rollout_id = first + n
    d.groups[gid] = g
    requests, version = d.requests, e.policy_version
    for rid in ids:
        requests[rid] = Request(rid, gid, version)
    d.pending += tuple(ids)  # the newest ids: the tuple stays sorted
    _bump(d.version_refs, version, n)


def _rollout_assigned(d: _Draft, e: ev.RolloutAssigned) -> None:
    _started(d, e)
    ids, n = e.rollout_ids, len(e.rollout_ids)
    if n == 0 or len(e.attempts) != n:
        raise _invalid(e, f"with {n} rollout ids and {len(e.attempts)} attempts")
    w = d.workers.get(e.worker_id)
    if w is None or w.role != "inference" or w.active + n > w.slots:
        raise _invalid(e, f"of {n} requests to worker {e.worker_id!r}, which is not an inference worker with {n} free slots")
    leased = []
    previous = -1
    for rid, attempt in zip(ids, e.attempts, strict=False):
        r = _live(d, e, rid)
        if r.done or r.holder is not None or attempt != r.attempts or rid <= previous:
            raise _invalid(e, f"attempt {attempt} of rollout {rid}, which is not pending in id order (state {r})")
        leased.append(r.evolve(attempts=r.attempts + 1, holder=w.worker_id))
        previous = rid
    requests = d.requests
    for r in leased:
        requests[r.rollout_id] = r
    pending = d.pending
    if pending[:n] == tuple(ids):  # the usual case: the oldest pending requests
        d.pending = pending[n:]
    else:
        taken = set(ids)
        d.pending = tuple(rid for rid in pending if rid not in taken)
    w = w.evolve(active=w.active + n)
    if w.active >= w.slots:
        d.free = remove_sorted(d.free, (w.order, w.worker_id))
    d.workers[w.worker_id] = w


def _rollout_completed(d: _Draft, e: ev.RolloutCompleted) -> None:
    r = d.requests[e.rollout_id]
    if r.holder is not None:  # leased, so not pending
        _release(d, r)
    else:  # its lease was given up: pending again
        d.pending = remove_sorted(d.pending, r.rollout_id)
    g = d.groups[r.group_id]
    d.requests[r.rollout_id] = r.evolve(holder=None, done=True)
    d.groups[g.group_id] = g.evolve(completed=g.completed + 1)
    _bump(d.version_refs, r.policy_version, -1)


def _rollout_abandoned(d: _Draft, e: ev.RolloutAbandoned) -> None:
    r = d.requests[e.rollout_id]
    _release(d, r)
    d.requests[r.rollout_id] = r.evolve(holder=None)
    d.pending = insert_sorted(d.pending, r.rollout_id)


def _outcome_recorded(d: _Draft, e: ev.OutcomeRecorded) -> None:
    spec = d.spec
    assert spec is not None  # the guard admits no outcome before RunStarted
    r = d.requests[e.rollout_id]
    g = d.groups[r.group_id]
    reward = float(e.reward)
    first = reward if g.first_reward is None else g.first_reward
    g = g.evolve(scored=g.scored + 1, first_reward=first, uniform=g.uniform and reward == first)
    d.requests[r.rollout_id] = r.evolve(reward=reward)
    d.groups[g.group_id] = g
    if not g.resolved:
        return
    if spec.mode == DETERMINISTIC:
        plan = d.plans[g.batch]
        if spec.filter_groups and g.uniform:
            d.plans[g.batch] = plan.evolve(uniform=plan.uniform + (g.ordinal,))
        else:
            d.plans[g.batch] = plan.evolve(good=plan.good + (g.ordinal,))
    else:
        d.ready += (g.group_id,)


def _drop_group(d: _Draft, g: Group) -> None:
    """Remove a group and its requests, giving back their leases."""
    for rid in g.rollout_ids:
        r = d.requests[rid]
        if r.holder is not None:
            _release(d, r)
        if not r.done:
            _bump(d.version_refs, r.policy_version, -1)
            d.pending = remove_sorted(d.pending, rid)
        del d.requests[rid]
    del d.groups[g.group_id]
    _bump(d.group_versions, g.policy_version, -1)


def _group_discarded(d: _Draft, e: ev.GroupDiscarded) -> None:
    _started(d, e)
    g = d.groups.get(e.group_id)
    if g is None:
        raise _invalid(e, f"for group {e.group_id}, which is not live")
    _drop_group(d, g)
    if e.group_id in d.ready:
        d.ready = tuple(x for x in d.ready if x != e.group_id)
    if e.reason == "uniform_reward":
        d.discards += 1


def _batch_formed(d: _Draft, e: ev.BatchFormed) -> None:
    spec = _started(d, e)
    if e.step != d.formed + 1:
        raise _invalid(e, f"for step {e.step}; the next batch is {d.formed + 1}")
    groups = []
    for gid in e.group_ids:
        g = d.groups.get(gid)
        if g is None or not g.resolved or g in groups:
            raise _invalid(e, f"takes group {gid}, which is not live and resolved")
        groups.append(g)
    for g in groups:
        _drop_group(d, g)
    consumed = set(e.group_ids)
    d.formed, d.discards, d.ready = e.step, 0, tuple(x for x in d.ready if x not in consumed)
    if spec.mode == DETERMINISTIC:
        del d.plans[e.step]


def _train_step_completed(d: _Draft, e: ev.TrainStepCompleted) -> None:
    d.trained = e.step


def _weights_published(d: _Draft, e: ev.WeightsPublished) -> None:
    d.versions[e.version] = e.digest
    d.latest = e.version
    spec = d.spec
    if spec is not None and spec.evaluated(e.version):  # versions come in order: the tuple stays sorted
        d.due_evaluations += ((e.version, e.digest),)


def _version_evaluated(d: _Draft, e: ev.VersionEvaluated) -> None:
    d.due_evaluations = tuple(due for due in d.due_evaluations if due[0] != e.version)


def _versions_retired(d: _Draft, e: ev.VersionsRetired) -> None:
    spec = _started(d, e)
    for v in e.versions:
        if v not in d.versions or v == d.latest or e.versions.count(v) > 1:
            raise _invalid(e, f"retires version {v}, which is not a retained older version")
        if spec.kept(v):
            raise _invalid(e, f"retires version {v}, a checkpoint params.keep_every {spec.keep_every} keeps")
    for v in e.versions:
        del d.versions[v]


def _run_finished(d: _Draft, e: ev.RunFinished) -> None:
    _started(d, e)
    d.finished = True


# Each handler takes the draft and an event of its key's kind.
_HANDLERS: dict[type, Callable[[_Draft, Any], None]] = {
    ev.RunStarted: _run_started,
    ev.RunForked: _run_forked,
    ev.ControllerStarted: _controller_started,
    ev.SnapshotTaken: _snapshot_taken,
    ev.WorkerJoined: _worker_joined,
    ev.WorkerLost: _worker_lost,
    ev.PromptsSampled: _prompts_sampled,
    ev.RolloutRequested: _rollout_requested,
    ev.RolloutAssigned: _rollout_assigned,
    ev.RolloutCompleted: _rollout_completed,
    ev.RolloutAbandoned: _rollout_abandoned,
    ev.OutcomeRecorded: _outcome_recorded,
    ev.GroupDiscarded: _group_discarded,
    ev.BatchFormed: _batch_formed,
    ev.TrainStepCompleted: _train_step_completed,
    ev.WeightsPublished: _weights_published,
    ev.VersionEvaluated: _version_evaluated,
    ev.VersionsRetired: _versions_retired,
    ev.RunFinished: _run_finished,
}


def _apply(d: _Draft, event: ev.Event) -> None:
    kind = type(event)
    handler = _HANDLERS.get(kind)
    if handler is None:
        raise InvalidEvent(f"the controller does not know events of kind {event.KIND}")
    if kind in INPUT_KINDS:
        why = guard(d, event)
        if why is not None:
            raise InvalidEvent(f"{event.KIND} rejected: {why}")
    handler(d, event)


def reduce(state: ControllerState, event: ev.Event) -> ControllerState:
    """The state after ``event``; raises ``InvalidEvent`` if it cannot follow ``state``."""
    d = _Draft(state)
    _apply(d, event)
    return d.finish()


def fold(events: Iterable[ev.Event], state: ControllerState = INITIAL) -> ControllerState:
    """``reduce`` over ``events`` from ``state`` (the empty state by default)."""
    d = _Draft(state)
    for event in events:
        _apply(d, event)
    return d.finish()


class Folder:
    """Folds events one at a time into a draft of ``state``; ``state()`` is the fold so far.

    For callers that interleave folding with reads of the state in progress (``admit`` reads
    a draft as it reads a state: attributes, ``get`` and ``in`` on maps).
    """

    def __init__(self, state: ControllerState) -> None:
        self.draft = _Draft(state)

    def apply(self, event: ev.Event) -> None:
        """Fold ``event``; raises ``InvalidEvent`` (then the folder must not be used again)."""
        _apply(self.draft, event)

    def admit(self, event: ev.Event) -> str | None:
        """Fold input ``event`` if ``admit`` accepts it and return None; else return why not,
        leaving the fold as it was (the guard runs before anything changes)."""
        why = admit(self.draft, event)
        if why is None:
            _HANDLERS[type(event)](self.draft, event)
        return why

    def state(self) -> ControllerState:
        return self.draft.finish()
