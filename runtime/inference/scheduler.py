"""Continuous batching decisions: which request runs in which slot, who is preempted.

A pure state machine over request ids; the engine runs the device work it decides. Request ids are
positions in the arrival order (the order of ``Engine.generate``'s prompts): lower is older.

Each engine step is ``plan`` (decide), the device work, then ``advance`` (record); an engine that
runs several decode steps per device call ``reserve``s their pages after ``plan``. ``plan``:

1. *Grow.* Every running request, oldest first, gets the pages for the token the step will write
   (``cached + 1`` tokens). When the pool is short, the youngest running request is preempted by
   recompute: its pages and slot are freed and it goes back to the queue, keeping the tokens it
   generated (the engine replays them when it is readmitted). The oldest running request is never
   preempted for a younger one, so it always progresses and the run terminates.
2. *Admit.* Unless a preemption happened in this plan (readmitting at once would thrash), queued
   requests, oldest first, take the free slots (lowest slot first) while the pool holds their
   prompt plus the first generated token. Static batching admits only into an empty batch.
   A request of a group (the same prompt) admitted while the group's *holder* runs, the last
   request of the group that was admitted without sharing (so prefilled), shares the holder's
   full prompt pages (``PagePool.share``) and needs pages only for the rest: the last, partially
   filled prompt page, which the engine copies (copy on write at the first page the two write
   differently), and the pages after it. A request admitted when the holder has finished or
   was preempted is prefilled and becomes the holder.

Pages are counted once however many requests share them: ``fits``, ``reserve`` and a preemption
(which frees only the pages no other request holds) all read the one pool. A readmitted request
is prefilled from its prompt alone, or shares again with its group's running holder:
either way its cache then holds exactly the bits it held before (see ``engine``), whatever the
slots and pages it gets.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping, Sequence

from runtime.inference.pages import PagePool


@dataclasses.dataclass(frozen=True)
class Decisions:
    """What one ``plan`` decided: preempted request ids, ``(request, slot)`` admissions, and
    ``(request, source)`` for each admitted request that shares ``source``'s prompt pages."""

    preempted: tuple[int, ...] = ()
    admitted: tuple[tuple[int, int], ...] = ()
    shared: tuple[tuple[int, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The batcher's state.

    Attributes:
      slots: the request in each decode slot, or None.
      waiting: queued request ids, ascending (oldest first).
      cached: running request id -> tokens in its KV cache (the position its next token takes).
      pool: the page allocator; a running request's pages are ``pool.owned(request)``.
      holders: group -> the request of the group last admitted without sharing (its holder while
        it runs; stale once it is not running).
    """

    slots: tuple[int | None, ...]
    waiting: tuple[int, ...]
    cached: Mapping[int, int]
    pool: PagePool
    holders: Mapping[int, int] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))

    @classmethod
    def start(cls, num_requests: int, *, max_slots: int, pool: PagePool) -> Schedule:
        """All requests queued, every slot empty, every page free."""
        if pool.num_used:
            raise ValueError(f"a schedule starts from an empty pool; {pool.num_used} are used")
        empty: Mapping[int, int] = types.MappingProxyType({})
        return cls((None,) * max_slots, tuple(range(num_requests)), empty, pool)

    @property
    def running(self) -> tuple[int, ...]:
        """Running request ids, ascending."""
        return tuple(sorted(r for r in self.slots if r is not None))

    @property
    def done(self) -> bool:
        return not self.waiting and all(r is None for r in self.slots)

    def slot_of(self, request: int) -> int:
        return self.slots.index(request)


def _preempt(state: Schedule, request: int) -> Schedule:
    cached = dict(state.cached)
    del cached[request]
    slots = tuple(None if r == request else r for r in state.slots)
    return dataclasses.replace(
        state,
        slots=slots,
        waiting=tuple(sorted(state.waiting + (request,))),
        cached=types.MappingProxyType(cached),
        pool=state.pool.release(request),
    )


def plan(
    state: Schedule,
    prompt_lengths: Sequence[int],
    *,
    static: bool = False,
    groups: Sequence[int] | None = None,
) -> tuple[Schedule, Decisions]:
    """Reserve pages for the next step, preempting and admitting as the module docstring says.

    Args:
      state: the schedule after the previous ``advance``.
      prompt_lengths: prompt length of every request, by id.
      static: admit only when no request is running (static batching).
      groups: by id, equal for requests with the same prompt (they may share its pages); None,
        nobody shares.

    Returns:
      The new schedule (admitted requests have ``cached`` = their prompt length) and the decisions.
    """
    preempted: list[int] = []
    for request in state.running:
        if request in preempted:
            continue
        while not state.pool.fits(request, state.cached[request] + 1):
            victim = state.running[-1]
            state = _preempt(state, victim)
            preempted.append(victim)
            if victim == request:
                break
        else:
            state = dataclasses.replace(
                state, pool=state.pool.grow(request, state.cached[request] + 1)
            )
    admitted: list[tuple[int, int]] = []
    shared: list[tuple[int, int]] = []
    if not preempted and not (static and state.running):
        slots, waiting = list(state.slots), list(state.waiting)
        cached, pool = dict(state.cached), state.pool
        # group -> its running holder (admitted before or by this plan)
        holders = {g: r for g, r in state.holders.items() if r in cached}
        for slot in range(len(slots)):
            if slots[slot] is not None or not waiting:
                continue
            request, length = waiting[0], prompt_lengths[waiting[0]]
            source = holders.get(groups[request]) if groups is not None else None
            full = length // pool.page_size if source is not None else 0
            with_prompt = pool.share(request, source, full) if full and source is not None else pool
            if not with_prompt.fits(request, length + 1):
                break
            waiting.pop(0)
            pool = with_prompt.grow(request, length + 1)
            slots[slot], cached[request] = request, length
            admitted.append((request, slot))
            if source is not None:
                shared.append((request, source))
            elif groups is not None:
                holders[groups[request]] = request
        state = Schedule(
            tuple(slots), tuple(waiting), types.MappingProxyType(cached), pool, types.MappingProxyType(holders)
        )
    if state.waiting and not state.running:
        raise AssertionError(f"request {state.waiting[0]} cannot fit an empty pool")
    return state, Decisions(tuple(preempted), tuple(admitted), tuple(shared))


def reserve(state: Schedule, tokens: Mapping[int, int]) -> Schedule | None:
    """Pages for several steps at once: running request ``r`` grows to ``cached + tokens[r]``.

    All or nothing, never preempting: None when the free pages do not cover every request (the
    caller then runs fewer steps; ``plan`` has already reserved one).
    """
    pool = state.pool
    need = sum(pool.shortfall(r, state.cached[r] + n) for r, n in tokens.items())
    if need > pool.num_free:
        return None
    for request in sorted(tokens):
        pool = pool.grow(request, state.cached[request] + tokens[request])
    return dataclasses.replace(state, pool=pool)


def rewind(state: Schedule, request: int, cached: int) -> Schedule:
    """Running ``request`` holds only its first ``cached`` tokens (at least its prompt): a request
    that goes on after a turn drops what its slot decoded past the turn's end, which its next
    tokens overwrite. It keeps its pages, slot and place in the queue."""
    if request not in state.cached or not 0 < cached <= state.cached[request]:
        raise ValueError(f"request {request} cannot rewind to {cached} tokens")
    return dataclasses.replace(state, cached=types.MappingProxyType({**state.cached, request: cached}))


def advance(
    state: Schedule, finished: Sequence[int] = (), steps: Mapping[int, int] | None = None
) -> Schedule:
    """Record decode steps; the ``finished`` requests leave.

    Running request ``r`` cached ``steps[r]`` more tokens (default: one each).
    """
    steps = steps or {}
    cached = {r: n + steps.get(r, 1) for r, n in state.cached.items()}
    pool, slots = state.pool, state.slots
    for request in finished:
        del cached[request]
        pool = pool.release(request)
        slots = tuple(None if r == request else r for r in slots)
    return dataclasses.replace(state, slots=slots, cached=types.MappingProxyType(cached), pool=pool)
