"""``reduce(state, event) -> state``: the controller's fold over the ledger.

Pure and strict: an event that cannot follow the state (a second completion of a request, a
lease of a request that is not pending, a version out of order) raises :class:`InvalidEvent`,
because the I/O loop admits only inputs that apply (``admit``) and ``decide`` only emits
decisions that apply. A ledger that folds without error is a history the controller could
have written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ledger import events as ev
from runtime.controller.spec import DETERMINISTIC, ControllerSpec
from runtime.controller.state import (
    INITIAL,
    ControllerState,
    Group,
    Plan,
    Request,
    Worker,
    bump,
    insert_sorted,
    remove_sorted,
)
from runtime.errors import RlxError


class InvalidEvent(RlxError):
    """An event that cannot follow the state it is applied to."""


def _invalid(e: ev.Event, why: str) -> InvalidEvent:
    return InvalidEvent(f"{e.KIND} {why}")


def _started(s: ControllerState, e: ev.Event) -> ControllerSpec:
    if s.spec is None:
        raise _invalid(e, "before RunStarted")
    return s.spec


def _released(s: ControllerState, r: Request) -> tuple:
    """``(workers, free)`` after the slot of ``r``'s lease holder is freed (if still joined)."""
    w = s.workers.get(r.holder)
    if w is None:
        return s.workers, s.free
    free = s.free
    if w.active >= w.slots:
        free = insert_sorted(free, (w.order, w.worker_id))
    return s.workers.set(w.worker_id, w.evolve(active=w.active - 1)), free


def _release(s: ControllerState, r: Request) -> ControllerState:
    """Free the slot of ``r``'s lease holder (if it is still joined)."""
    workers, free = _released(s, r)
    return s.evolve(workers=workers, free=free)


def _requeue_leases(s: ControllerState, holder: Callable[[str], bool]) -> ControllerState:
    """Give back every lease whose holder matches; the requests become pending again."""
    requests, pending = s.requests, s.pending
    for r in s.requests.values():
        if r.holder is not None and holder(r.holder):
            requests = requests.set(r.rollout_id, r.evolve(holder=None))
            pending = insert_sorted(pending, r.rollout_id)
    return s.evolve(requests=requests, pending=pending)


def _run_started(s: ControllerState, e: ev.RunStarted) -> ControllerState:
    if s.spec is not None:
        raise _invalid(e, "after the run already started")
    spec = ControllerSpec.from_config(e.config, e.seed)
    return s.evolve(spec=spec, run_id=e.run_id, config_digest=e.config_digest)


def _controller_started(s: ControllerState, e: ev.ControllerStarted) -> ControllerState:
    _started(s, e)
    if e.epoch <= s.epoch:
        raise _invalid(e, f"with epoch {e.epoch}, not above the current epoch {s.epoch}")
    # Leases and worker registrations belong to the previous controller: workers join again.
    s = _requeue_leases(s, lambda _: True)
    return s.evolve(epoch=e.epoch, workers=INITIAL.workers, free=())


def _worker_joined(s: ControllerState, e: ev.WorkerJoined) -> ControllerState:
    _started(s, e)
    if e.worker_id in s.workers:
        raise _invalid(e, f"for worker {e.worker_id!r}, which is already joined")
    if e.slots < 1:
        raise _invalid(e, f"with {e.slots} slots")
    w = Worker(e.worker_id, e.role, e.slots, s.joins)
    free = insert_sorted(s.free, (w.order, w.worker_id)) if e.role == "inference" else s.free
    return s.evolve(workers=s.workers.set(w.worker_id, w), free=free, joins=s.joins + 1)


def _worker_lost(s: ControllerState, e: ev.WorkerLost) -> ControllerState:
    _started(s, e)
    w = s.workers.get(e.worker_id)
    if w is None:
        raise _invalid(e, f"for worker {e.worker_id!r}, which is not joined")
    s = _requeue_leases(s, lambda holder: holder == e.worker_id)
    return s.evolve(workers=s.workers.delete(w.worker_id), free=remove_sorted(s.free, (w.order, w.worker_id)))


def _prompts_sampled(s: ControllerState, e: ev.PromptsSampled) -> ControllerState:
    _started(s, e)
    if e.position < 0:
        return s
    if e.position != s.position:
        raise _invalid(e, f"at stream position {e.position}; the stream is at {s.position}")
    return s.evolve(position=s.position + len(e.prompt_indices))


def _rollout_requested(s: ControllerState, e: ev.RolloutRequested) -> ControllerState:
    spec = _started(s, e)
    if e.rollout_id != s.next_rollout_id:
        raise _invalid(e, f"for rollout {e.rollout_id}; the next rollout id is {s.next_rollout_id}")
    if e.policy_version not in s.versions:
        raise _invalid(e, f"from version {e.policy_version}, which is not a published, retained version")
    gid = e.group_id
    if gid == s.next_group_id:
        g = Group(gid, e.batch, e.ordinal, e.prompt_index, e.policy_version, (e.rollout_id,))
        s = s.evolve(next_group_id=gid + 1, group_versions=bump(s.group_versions, e.policy_version, 1))
        if spec.mode == DETERMINISTIC:
            plan = s.plans.get(e.batch) or Plan(e.batch, e.policy_version)
            if e.ordinal != len(plan.groups):
                raise _invalid(e, f"with ordinal {e.ordinal}; batch {e.batch} has {len(plan.groups)} groups")
            s = s.evolve(plans=s.plans.set(e.batch, plan.evolve(groups=plan.groups + (gid,))),
                           requested=max(s.requested, e.batch))
        else:
            if (e.batch, e.ordinal) != s.label:
                raise _invalid(e, f"labelled {(e.batch, e.ordinal)}; the next label is {s.label}")
            nxt = e.ordinal + 1
            s = s.evolve(label=(e.batch + 1, 0) if nxt == spec.groups_per_batch else (e.batch, nxt))
    else:
        g = s.groups.get(gid)
        if g is None or gid != s.next_group_id - 1 or len(g.rollout_ids) >= spec.group_size:
            raise _invalid(e, f"adds to group {gid}, which is not the open group")
        if (g.batch, g.ordinal, g.prompt_index, g.policy_version) != (e.batch, e.ordinal, e.prompt_index, e.policy_version):
            raise _invalid(e, f"differs from its group {gid} in batch, ordinal, prompt or version")
        g = g.evolve(rollout_ids=g.rollout_ids + (e.rollout_id,))
    return s.evolve(
        next_rollout_id=e.rollout_id + 1,
        groups=s.groups.set(gid, g),
        requests=s.requests.set(e.rollout_id, Request(e.rollout_id, gid, e.policy_version)),
        pending=s.pending + (e.rollout_id,),
        version_refs=bump(s.version_refs, e.policy_version, 1),
    )


def _live(s: ControllerState, e: ev.Event, rollout_id: int) -> Request:
    r = s.requests.get(rollout_id)
    if r is None:
        raise _invalid(e, f"for rollout {rollout_id}, which is not a live request")
    return r


def _rollout_assigned(s: ControllerState, e: ev.RolloutAssigned) -> ControllerState:
    if s.spec is None:
        raise _invalid(e, "before RunStarted")
    r = s.requests.get(e.rollout_id)
    if r is None:
        raise _invalid(e, f"for rollout {e.rollout_id}, which is not a live request")
    if r.done or r.holder is not None or e.attempt != r.attempts:
        raise _invalid(e, f"attempt {e.attempt} of rollout {e.rollout_id}, which is not pending (state {r})")
    w = s.workers.get(e.worker_id)
    if w is None or w.role != "inference" or w.active >= w.slots:
        raise _invalid(e, f"to worker {e.worker_id!r}, which has no free inference slot")
    w = w.evolve(active=w.active + 1)
    free = remove_sorted(s.free, (w.order, w.worker_id)) if w.active >= w.slots else s.free
    return s.evolve(
        requests=s.requests.set(r.rollout_id, r.evolve(attempts=r.attempts + 1, holder=w.worker_id)),
        pending=remove_sorted(s.pending, r.rollout_id),
        workers=s.workers.set(w.worker_id, w),
        free=free,
    )


def _rollout_completed(s: ControllerState, e: ev.RolloutCompleted) -> ControllerState:
    if s.spec is None:
        raise _invalid(e, "before RunStarted")
    r = s.requests.get(e.rollout_id)
    if r is None:
        raise _invalid(e, f"for rollout {e.rollout_id}, which is not a live request")
    if r.done or not 0 <= e.attempt < r.attempts or e.policy_version != r.policy_version:
        raise _invalid(e, f"attempt {e.attempt} of rollout {e.rollout_id} does not complete {r}")
    if r.holder is not None:  # leased: not pending
        workers, free = _released(s, r)
        pending = s.pending
    else:  # its lease was given up and it is pending again
        workers, free = s.workers, s.free
        pending = remove_sorted(s.pending, r.rollout_id)
    g = s.groups[r.group_id]
    return s.evolve(
        requests=s.requests.set(r.rollout_id, r.evolve(holder=None, done=True)),
        groups=s.groups.set(g.group_id, g.evolve(completed=g.completed + 1)),
        pending=pending,
        workers=workers,
        free=free,
        version_refs=bump(s.version_refs, r.policy_version, -1),
    )


def _rollout_abandoned(s: ControllerState, e: ev.RolloutAbandoned) -> ControllerState:
    _started(s, e)
    r = _live(s, e, e.rollout_id)
    if r.done or r.holder is None or e.attempt != r.attempts - 1:
        raise _invalid(e, f"attempt {e.attempt} of rollout {e.rollout_id}, which is not the current lease")
    s = _release(s, r)
    return s.evolve(
        requests=s.requests.set(r.rollout_id, r.evolve(holder=None)),
        pending=insert_sorted(s.pending, r.rollout_id),
    )


def _outcome_recorded(s: ControllerState, e: ev.OutcomeRecorded) -> ControllerState:
    spec = s.spec
    if spec is None:
        raise _invalid(e, "before RunStarted")
    r = s.requests.get(e.rollout_id)
    if r is None:
        raise _invalid(e, f"for rollout {e.rollout_id}, which is not a live request")
    if not r.done or r.reward is not None:
        raise _invalid(e, f"for rollout {e.rollout_id}, which is not completed and unscored")
    g = s.groups[r.group_id]
    reward = float(e.reward)
    first = reward if g.first_reward is None else g.first_reward
    g = g.evolve(scored=g.scored + 1, first_reward=first, uniform=g.uniform and reward == first)
    requests, groups = s.requests.set(r.rollout_id, r.evolve(reward=reward)), s.groups.set(g.group_id, g)
    if not g.resolved:
        return s.evolve(requests=requests, groups=groups)
    if spec.mode == DETERMINISTIC:
        plan = s.plans[g.batch]
        if spec.filter_groups and g.uniform:
            plan = plan.evolve(uniform=plan.uniform + (g.ordinal,))
        else:
            plan = plan.evolve(good=plan.good + (g.ordinal,))
        return s.evolve(requests=requests, groups=groups, plans=s.plans.set(g.batch, plan))
    return s.evolve(requests=requests, groups=groups, ready=s.ready + (g.group_id,))


def _drop_group(s: ControllerState, g: Group) -> ControllerState:
    """Remove a group and its requests, giving back their leases."""
    requests, refs, pending = s.requests, s.version_refs, s.pending
    for rid in g.rollout_ids:
        r = requests[rid]
        if r.holder is not None:
            s = _release(s, r)
        if not r.done:
            refs = bump(refs, r.policy_version, -1)
            pending = remove_sorted(pending, rid)
        requests = requests.delete(rid)
    return s.evolve(
        requests=requests,
        version_refs=refs,
        pending=pending,
        groups=s.groups.delete(g.group_id),
        group_versions=bump(s.group_versions, g.policy_version, -1),
    )


def _group_discarded(s: ControllerState, e: ev.GroupDiscarded) -> ControllerState:
    _started(s, e)
    g = s.groups.get(e.group_id)
    if g is None:
        raise _invalid(e, f"for group {e.group_id}, which is not live")
    s = _drop_group(s, g)
    if e.group_id in s.ready:
        s = s.evolve(ready=tuple(x for x in s.ready if x != e.group_id))
    if e.reason == "uniform_reward":
        s = s.evolve(discards=s.discards + 1)
    return s


def _batch_formed(s: ControllerState, e: ev.BatchFormed) -> ControllerState:
    spec = _started(s, e)
    if e.step != s.formed + 1:
        raise _invalid(e, f"for step {e.step}; the next batch is {s.formed + 1}")
    for gid in e.group_ids:
        g = s.groups.get(gid)
        if g is None or not g.resolved:
            raise _invalid(e, f"takes group {gid}, which is not live and resolved")
        s = _drop_group(s, g)
    consumed = set(e.group_ids)
    s = s.evolve(formed=e.step, discards=0, ready=tuple(x for x in s.ready if x not in consumed))
    if spec.mode == DETERMINISTIC:
        s = s.evolve(plans=s.plans.delete(e.step))
    return s


def _train_step_completed(s: ControllerState, e: ev.TrainStepCompleted) -> ControllerState:
    _started(s, e)
    if e.step != s.trained + 1 or e.step > s.formed or s.latest != e.step - 1:
        raise _invalid(e, f"for step {e.step}; trained {s.trained}, formed {s.formed}, latest version {s.latest}")
    return s.evolve(trained=e.step)


def _weights_published(s: ControllerState, e: ev.WeightsPublished) -> ControllerState:
    _started(s, e)
    v = e.version
    if v != s.latest + 1 or (v > 0 and v != s.trained):
        raise _invalid(e, f"for version {v}; latest {s.latest}, trained {s.trained}")
    if v > 0 and (e.parent_version != v - 1 or e.parent_digest != s.versions.get(v - 1)):
        raise _invalid(e, f"for version {v} names parent {e.parent_version} {e.parent_digest[:12]}…")
    return s.evolve(versions=s.versions.set(v, e.digest), latest=v)


def _versions_retired(s: ControllerState, e: ev.VersionsRetired) -> ControllerState:
    _started(s, e)
    versions = s.versions
    for v in e.versions:
        if v not in versions or v == s.latest:
            raise _invalid(e, f"retires version {v}, which is not a retained older version")
        versions = versions.delete(v)
    return s.evolve(versions=versions)


def _run_finished(s: ControllerState, e: ev.RunFinished) -> ControllerState:
    _started(s, e)
    return s.evolve(finished=True)


_HANDLERS: dict[type, Callable[[ControllerState, ev.Event], ControllerState]] = {
    ev.RunStarted: _run_started,
    ev.ControllerStarted: _controller_started,
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
    ev.VersionsRetired: _versions_retired,
    ev.RunFinished: _run_finished,
}


def reduce(state: ControllerState, event: ev.Event) -> ControllerState:
    """The state after ``event``; raises ``InvalidEvent`` if it cannot follow ``state``."""
    handler = _HANDLERS.get(type(event))
    if handler is None:
        raise InvalidEvent(f"the controller does not know events of kind {event.KIND}")
    return handler(state, event)


def fold(events: Iterable[ev.Event], state: ControllerState = INITIAL) -> ControllerState:
    """``reduce`` over ``events`` from ``state`` (the empty state by default)."""
    for event in events:
        state = _HANDLERS[type(event)](state, event) if type(event) in _HANDLERS else reduce(state, event)
    return state
