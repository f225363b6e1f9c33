"""``decide(state) -> list[event]``: every decision the controller takes in a state.

Pure: the result depends on the state alone (no clock, no global RNG, no dict order: maps are
only looked up, iteration goes over sorted keys or ordered tuples). ``decide`` runs its rules
to a fixpoint, folding each decision into a private copy of the state, so
``decide(fold(state, decide(state))) == []``: the I/O loop appends the inputs it received and
then the whole decision list, and replay checks each logged decision run against ``decide``
of the state before it.

Rules, in priority order (the first that applies fires, then all are tried again):

1. **finish**: the last step's weights are published → ``RunFinished``.
2. **retire**: published versions that nothing needs any more and that are no checkpoint
   (``params.keep_every``, :meth:`ControllerSpec.kept`) → ``VersionsRetired`` (I5).
3. **discard** (freshest mode): groups whose version is below the next batch's staleness
   bound → ``GroupDiscarded(stale)``; resolved groups with uniform rewards while filtering →
   ``GroupDiscarded(uniform_reward)``.
4. **form** the next batch → (deterministic mode: ``GroupDiscarded`` of its unselected groups,
   ``uniform_reward`` or ``surplus``) ``BatchFormed``.
5. **request** new groups → ``PromptsSampled`` + one ``RolloutRequested`` per group.
6. **assign** pending requests to inference workers with free slots → one ``RolloutAssigned``
   per worker.

Deterministic mode: batch ``s`` is requested once version ``max(0, s-1-k)`` is published, and
only from it. Its groups have ordinals 0, 1, …; ordinal ``o < G`` takes the prompt at stream
position ``(s-1)·G + o``, later ordinals (replacing filtered groups) a keyed draw. When
filtering, a new ordinal is requested while fewer than ``G`` groups have resolved non-uniform,
fewer than the ``G`` minus those, plus ``draw_ahead``, are unresolved, and fewer than
``max_groups_per_batch`` are requested; the batch is formed once every requested group has
resolved. The requested ordinals are thus a prefix ``0..M-1`` holding at least ``G``
non-uniform groups (or the cap); with ``draw_ahead = 0`` exactly the shortest such prefix,
whatever order results arrive in, and with more, a longer one that depends on the order. The
batch takes the ``G`` lowest non-uniform ordinals of that prefix (topped up with the lowest
uniform ordinals at the cap), in ordinal order, and drops the other non-uniform groups as
``surplus``. A group's rewards do not depend on when it resolves, and the ``G`` lowest
non-uniform ordinals of any prefix holding ``G`` are those of the whole sequence, so the batch's
content is a function of the seed, data and weights alone (I7), whatever ``M`` is.

Freshest mode: new groups are requested from the newest version while fewer than
``(k+1)·G`` groups are live or formed and untrained; batches take resolved groups in the order
they resolved.
"""

from __future__ import annotations

from ledger import events as ev
from runtime import rng
from runtime.controller.reduce import fold
from runtime.controller.spec import DETERMINISTIC, ControllerSpec
from runtime.controller.state import ControllerState

STALE = "stale"
UNIFORM = "uniform_reward"
SURPLUS = "surplus"  # a good group beyond a batch's groups_per_batch (scheduling.draw_ahead)


def decide(state: ControllerState) -> list[ev.Event]:
    """All decisions ``state`` calls for, in the order they are to be appended."""
    return decide_and_fold(state)[0]


def decide_and_fold(state: ControllerState) -> tuple[list[ev.Event], ControllerState]:
    """``decide(state)`` and the state after folding those decisions into it."""
    out: list[ev.Event] = []
    while True:
        step = _next(state)
        if not step:
            return out, state
        state = fold(step, state)
        out.extend(step)


def _next(s: ControllerState) -> list[ev.Event]:
    if s.spec is None or s.finished:
        return []
    return _finish(s) or _retire(s) or _discard(s) or _form(s) or _request(s) or _assign(s)


def _spec(s: ControllerState) -> ControllerSpec:
    """The run's spec: decisions are made only after ``RunStarted`` (``_next`` checks)."""
    spec = s.spec
    assert spec is not None
    return spec


def _finish(s: ControllerState) -> list[ev.Event]:
    steps = _spec(s).steps
    if s.trained == steps and s.latest == steps:
        return [ev.RunFinished(steps, s.versions[steps])]
    return []


def needed_versions(s: ControllerState) -> tuple[set[int], int | None]:
    """Versions the run still needs, and the lowest version a future request may use (or None).

    Version 0 is never retired: it is the root every replay starts from. Needed besides: the
    newest (training continues from it; a resume starts from it), every version a
    live incomplete request was made from, and in deterministic mode the versions of unformed
    batches (a filtered group is replaced from the same version) and every version from that of
    the next unrequested batch on.
    """
    spec = _spec(s)
    needed = {s.latest, *s.version_refs.keys()}
    future = None
    if spec.mode == DETERMINISTIC:
        needed.update(p.version for p in s.plans.values())
        if s.requested < spec.steps:
            future = spec.batch_version(s.requested + 1)
    return needed, future


def _retire(s: ControllerState) -> list[ev.Event]:
    spec = _spec(s)
    newest_kept = s.latest - spec.keep_newest
    if newest_kept < 1:
        return []
    # Retained versions in 1..newest_kept, counted without a scan: a long run keeps many
    # checkpoints, and this rule is tried after every decision. Every checkpoint up to the newest
    # is still there (the reducer refuses to retire one), so equal counts mean nothing else is.
    newer = sum(1 for v in range(newest_kept + 1, s.latest + 1) if v in s.versions)
    if len(s.versions) - (0 in s.versions) - newer <= spec.kept_through(newest_kept):
        return []
    candidates = [v for v in s.versions.keys() if 0 < v <= newest_kept and not spec.kept(v)]
    needed, future = needed_versions(s)
    old = sorted(v for v in candidates if v not in needed and (future is None or v < future))
    return [ev.VersionsRetired(tuple(old))] if old else []


def _discard(s: ControllerState) -> list[ev.Event]:
    spec = _spec(s)
    if spec.mode == DETERMINISTIC:
        return []
    bound = s.formed - spec.max_staleness  # the next batch, formed + 1, needs v >= formed - k
    if any(v < bound for v in s.group_versions.keys()):
        stale = sorted(g.group_id for g in s.groups.values() if g.policy_version < bound)
        return [ev.GroupDiscarded(gid, STALE) for gid in stale]
    allowance = spec.max_groups_per_batch - spec.groups_per_batch - s.discards
    if spec.filter_groups and allowance > 0:
        uniform = [gid for gid in s.ready if s.groups[gid].uniform][:allowance]
        return [ev.GroupDiscarded(gid, UNIFORM) for gid in uniform]
    return []


def _form(s: ControllerState) -> list[ev.Event]:
    spec = _spec(s)
    step = s.formed + 1
    if step > spec.steps:
        return []
    G = spec.groups_per_batch
    if spec.mode == DETERMINISTIC:
        plan = s.plans.get(step)
        if plan is None or plan.resolved < len(plan.groups):
            return []
        if len(plan.good) < G and len(plan.groups) < spec.max_groups_per_batch:
            return []
        good, uniform = sorted(plan.good), sorted(plan.uniform)
        chosen = set(good[:G] + uniform[: max(0, G - len(good))])
        out: list[ev.Event] = [
            ev.GroupDiscarded(plan.groups[o], SURPLUS if o in plan.good else UNIFORM)
            for o in range(len(plan.groups)) if o not in chosen
        ]
        group_ids = tuple(plan.groups[o] for o in sorted(chosen))
    else:
        if len(s.ready) < G:
            return []
        out, group_ids = [], s.ready[:G]
    rollout_ids: list[int] = []
    versions: list[int] = []
    for gid in group_ids:
        g = s.groups[gid]
        rollout_ids.extend(g.rollout_ids)
        versions.extend([g.policy_version] * len(g.rollout_ids))
    out.append(ev.BatchFormed(step, tuple(group_ids), tuple(rollout_ids), tuple(versions)))
    return out


def _group(s: ControllerState, batch: int, ordinal: int, prompt: int, version: int) -> list[ev.Event]:
    spec = _spec(s)
    first, size = s.next_rollout_id, spec.group_size
    seeds = rng.rollout_seeds(spec.seed, batch, ordinal, size)
    return [ev.RolloutRequested(tuple(range(first, first + size)), s.next_group_id, batch, prompt, version, seeds,
                                spec.sampling, ordinal)]


def _draw(spec: ControllerSpec, position: int) -> tuple[int, int]:
    return rng.stream_prompt(spec.seed, spec.dataset_size, position)


def _request(s: ControllerState) -> list[ev.Event]:
    spec = _spec(s)
    G = spec.groups_per_batch
    if spec.mode == DETERMINISTIC:
        batch = s.requested + 1
        if batch <= spec.steps and spec.batch_version(batch) in s.versions:
            draws = [_draw(spec, s.position + o) for o in range(G)]
            out: list[ev.Event] = [ev.PromptsSampled(batch, draws[0][0], tuple(i for _, i in draws), 0, s.position)]
            version = spec.batch_version(batch)
            for o, (_, prompt) in enumerate(draws):
                sub = s.evolve(next_group_id=s.next_group_id + o, next_rollout_id=s.next_rollout_id + o * spec.group_size)
                out.extend(_group(sub, batch, o, prompt, version))
            return out
        if not spec.filter_groups:
            return []
        for batch in sorted(s.plans.keys()):
            plan = s.plans[batch]
            n, good = len(plan.groups), len(plan.good)
            # In flight: as many groups as the batch still needs, and draw_ahead more.
            if good < G and n - plan.resolved < G - good + spec.draw_ahead and n < spec.max_groups_per_batch:
                prompt = rng.resample_prompt(spec.seed, spec.dataset_size, batch, n)
                epoch = (batch - 1) * G // spec.dataset_size
                return [ev.PromptsSampled(batch, epoch, (prompt,), n, -1), *_group(s, batch, n, prompt, plan.version)]
        return []
    if s.latest < 0:
        return []
    in_training = (s.formed - s.trained) * G
    limit = min((spec.max_staleness + 1) * G - in_training, (spec.steps - s.formed) * G)
    if len(s.groups) >= limit:
        return []
    epoch, prompt = _draw(spec, s.position)
    batch, ordinal = s.label
    return [ev.PromptsSampled(batch, epoch, (prompt,), ordinal, s.position), *_group(s, batch, ordinal, prompt, s.latest)]


def _assign(s: ControllerState) -> list[ev.Event]:
    """Pending requests in id order fill the free workers in join order, one event per worker."""
    if not s.pending or not s.free:
        return []
    out: list[ev.Event] = []
    pending, requests = s.pending, s.requests
    start = 0
    for _, wid in s.free:
        if start == len(pending):
            break
        w = s.workers[wid]
        ids = pending[start:start + w.slots - w.active]
        start += len(ids)
        out.append(ev.RolloutAssigned(wid, ids, tuple(requests[rid].attempts for rid in ids)))
    return out
