"""The batching decisions: admission order, static batches, preemption of the youngest."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.inference.pages import PagePool, pages_for
from runtime.inference.scheduler import Decisions, Schedule, advance, plan, reserve


def _start(n, slots=3, pages=9, page_size=4):
    pool = PagePool.create(num_pages=pages, page_size=page_size)
    return Schedule.start(n, max_slots=slots, pool=pool)


def test_admits_oldest_first_into_the_lowest_free_slots():
    state, decisions = plan(_start(5), [3, 5, 4, 2, 2])
    # Prompt + first token: 4, 6, 5 tokens -> 1 + 2 + 2 = 5 of 8 pages.
    assert decisions == Decisions(admitted=((0, 0), (1, 1), (2, 2)))
    assert state.slots == (0, 1, 2) and state.waiting == (3, 4)
    assert dict(state.cached) == {0: 3, 1: 5, 2: 4} and state.pool.num_used == 5
    state = advance(state, finished=[1])
    assert dict(state.cached) == {0: 4, 2: 5} and state.pool.owned(1) == ()
    state, decisions = plan(state, [3, 5, 4, 2, 2])
    assert decisions.admitted == ((3, 1),) and state.slots == (0, 3, 2)


def test_static_batching_waits_for_the_whole_batch():
    lengths = [2, 2, 2, 2]
    state, _ = plan(_start(4, slots=2), lengths, static=True)
    state = advance(state, finished=[0])
    state, decisions = plan(state, lengths, static=True)
    assert decisions.admitted == () and state.slots == (None, 1)
    state = advance(state, finished=[1])
    state, decisions = plan(state, lengths, static=True)
    assert decisions.admitted == ((2, 0), (3, 1))


def test_out_of_pages_preempts_the_youngest_and_admits_nobody():
    lengths = [4, 4, 4, 1]
    # 4 usable pages of 4 tokens; a prompt of 4 + its first token takes 2 pages: two requests fit.
    state, decisions = plan(_start(4, slots=3, pages=5), lengths)
    assert decisions.admitted == ((0, 0), (1, 1)) and state.waiting == (2, 3)
    for _ in range(3):  # cached 4 -> 7: still within 2 pages each
        state = advance(state)
        state, decisions = plan(state, lengths)
        assert decisions == Decisions()
    state = advance(state)  # cached 8: the next token needs a third page, none is free
    state, decisions = plan(state, lengths)
    assert decisions == Decisions(preempted=(1,))
    assert state.slots == (0, None, None) and state.waiting == (1, 2, 3)
    assert state.pool.owned(0) == (1, 2, 3)  # request 1's first page went to request 0


def test_reserve_grows_every_request_or_none_and_advance_counts_the_steps():
    lengths = [3, 5]
    state, _ = plan(_start(2, slots=2, pages=6), lengths)  # pages: 1 + 2 of 5
    # 3 + 4 = 7 and 5 + 4 = 9 tokens: 2 + 3 pages, all 5 usable ones.
    grown = reserve(state, {0: 4, 1: 4})
    assert grown.pool.owned(0) == state.pool.owned(0) + (4,)
    assert len(grown.pool.owned(1)) == 3 and grown.pool.num_free == 0
    assert reserve(state, {0: 4, 1: 8}) is None  # 13 tokens for request 1: all or nothing
    assert state.pool.num_used == 3  # the old value is unchanged
    after = advance(grown, finished=[0], steps={0: 2, 1: 4})
    assert dict(after.cached) == {1: 9} and after.pool.owned(0) == ()


@settings(max_examples=40)
@given(
    requests=st.lists(st.tuples(st.integers(1, 9), st.integers(1, 12)), min_size=1, max_size=8),
    slots=st.integers(1, 4),
    pages=st.integers(6, 14),
    static=st.booleans(),
)
def test_every_request_finishes_once_within_its_pages(requests, slots, pages, static):
    page_size = 2
    capacity = pages - 1
    requests = [(n, m) for n, m in requests if pages_for(n + m, page_size) <= capacity]
    lengths = [n for n, _ in requests]
    generated = [0] * len(requests)
    finished_at: dict[int, int] = {}
    state = _start(len(requests), slots=slots, pages=pages, page_size=page_size)
    for step in range(10_000):
        if state.done:
            break
        before = state
        state, decisions = plan(state, lengths, static=static)
        running = state.running
        assert len(set(running)) == len(running) and not set(running) & set(state.waiting)
        assert list(state.waiting) == sorted(state.waiting)
        if decisions.admitted and static:
            assert not before.running
        for victim in decisions.preempted:
            # Only the youngest go: every request still running is older than every victim.
            assert all(r < victim for r in running)
        for r in running:
            assert len(state.pool.owned(r)) == pages_for(state.cached[r] + 1, page_size)
        assert state.pool.num_used == sum(len(state.pool.owned(r)) for r in running)
        done = []
        for r in running:
            t = state.cached[r] - lengths[r]
            if t == generated[r]:
                generated[r] += 1
                if generated[r] == requests[r][1]:
                    done.append(r)
                    finished_at[r] = step
        state = advance(state, done)
    assert state.done and state.pool.num_used == 0
    assert sorted(finished_at) == list(range(len(requests)))
    assert generated == [m for _, m in requests]


def test_a_group_shares_its_full_prompt_pages_and_a_preempted_sharer_frees_only_its_own():
    lengths = [10, 10, 10]  # one prompt of 10 tokens, three samples: 2 full pages of 4, 2 left over
    # 7 usable pages: the first takes 3 (11 tokens), each other 1 (its partial page), 5 in all.
    state, decisions = plan(_start(3, slots=3, pages=8), lengths, groups=[0, 0, 0])
    assert decisions.admitted == ((0, 0), (1, 1), (2, 2)) and decisions.shared == ((1, 0), (2, 0))
    assert state.pool.owned(0) == (1, 2, 3) and state.pool.owned(1) == (1, 2, 4)
    assert state.pool.owned(2) == (1, 2, 5) and state.pool.num_used == 5
    # Without groups the same three need 9 pages: only two fit.
    assert plan(_start(3, slots=3, pages=8), lengths)[1].admitted == ((0, 0), (1, 1))
    state = advance(state)  # cached 11, the next token makes 12: each still within its 3 pages
    state, decisions = plan(state, lengths, groups=[0, 0, 0])
    assert decisions == Decisions()
    state = advance(state)  # cached 12: the 13th token needs a fourth page each; 2 are free
    state, decisions = plan(state, lengths, groups=[0, 0, 0])
    assert decisions == Decisions(preempted=(2,))
    # Request 2's own page (5) came back and went to request 1; the shared ones stay with 0 and 1.
    assert state.pool.owned(0) == (1, 2, 3, 6) and state.pool.owned(1) == (1, 2, 4, 7)
    assert state.pool.free == (5,) and dict(state.pool.refs)[1] == 2
    # 17 tokens take a fifth page: one is free, so one request may reserve it, not both.
    assert reserve(state, {0: 5, 1: 5}) is None
    assert reserve(state, {0: 5, 1: 4}).pool.owned(0) == (1, 2, 3, 6, 5)
    # Readmitted when no member of its group runs (no holder), request 2 holds a prompt of its own.
    state = advance(state, finished=[0, 1])
    assert state.pool.num_used == 0 and not state.pool.refs
    state, decisions = plan(state, lengths, groups=[0, 0, 0])
    assert decisions.admitted == ((2, 0),) and decisions.shared == () and len(state.pool.owned(2)) == 3


@settings(max_examples=60, deadline=None)
@given(
    groups=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 4)), min_size=1, max_size=4),
    max_tokens=st.lists(st.integers(1, 10), min_size=16, max_size=16),
    slots=st.integers(1, 6),
    page_size=st.integers(1, 5),
    spare=st.integers(0, 8),
    static=st.booleans(),
)
def test_shared_pages_are_counted_once_and_all_come_back(groups, max_tokens, slots, page_size, spare, static):
    """Groups of requests with one prompt each, in a pool from just over one sequence upwards."""
    lengths, group_of = [], []
    for g, (length, size) in enumerate(groups):
        lengths += [length] * size
        group_of += [g] * size
    group_ids = [group_of.index(g) for g in group_of]  # the group's first request, as the engine names it
    wants = [max_tokens[r % 16] for r in range(len(lengths))]
    pages = max(pages_for(n + m, page_size) for n, m in zip(lengths, wants, strict=True)) + 1 + spare
    state = _start(len(lengths), slots=slots, pages=pages, page_size=page_size)
    generated = [0] * len(lengths)
    preemptions = 0
    holders_seen: set[int] = set()  # requests admitted without sharing (prefilled)
    for _ in range(10_000):
        if state.done:
            break
        state, decisions = plan(state, lengths, static=static, groups=group_ids)
        preemptions += len(decisions.preempted)
        shared = dict(decisions.shared)
        holders_seen.update(r for r, _ in decisions.admitted if r not in shared)
        for request, source in decisions.shared:
            # the group's holder: running (admitted now or before), prefilled, not sharing itself
            assert source in state.running and source not in shared and group_ids[source] == group_ids[request]
            assert source in holders_seen
            full = lengths[request] // page_size
            assert state.pool.owned(request)[:full] == state.pool.owned(source)[:full]
            # Its own pages start at the partial prompt page, the first it writes differently.
            assert not set(state.pool.owned(request)[full:]) & set(state.pool.owned(source))
        pool = state.pool
        held = {p for r in state.running for p in pool.owned(r)}
        assert pool.num_used == len(held) and set(pool.tables) == set(state.running)
        assert dict(pool.refs) == {p: sum(p in pool.owned(r) for r in state.running) for p in held}
        for r in state.running:
            assert len(pool.owned(r)) == pages_for(state.cached[r] + 1, page_size)
        done = []
        for r in state.running:
            if state.cached[r] - lengths[r] == generated[r]:
                generated[r] += 1
                if generated[r] == wants[r]:
                    done.append(r)
        state = advance(state, done)
    assert state.done and state.pool.num_used == 0 and not state.pool.refs and not state.pool.tables
    assert generated == wants


def test_a_request_admitted_later_shares_with_its_groups_running_holder_and_prefills_once_it_is_gone():
    lengths = [10, 10, 10, 10]  # one prompt, four samples, two slots: they cannot all start together
    state, decisions = plan(_start(4, slots=2, pages=20), lengths, groups=[0, 0, 0, 0])
    assert decisions.admitted == ((0, 0), (1, 1)) and decisions.shared == ((1, 0),)
    state = advance(state, finished=[1])
    state, decisions = plan(state, lengths, groups=[0, 0, 0, 0])
    # Request 0 (prefilled) still runs: request 2 takes its full prompt pages, a plan later.
    assert decisions.admitted == ((2, 1),) and decisions.shared == ((2, 0),)
    assert state.pool.owned(2)[:2] == state.pool.owned(0)[:2] and state.holders[0] == 0
    state = advance(state, finished=[0])
    state, decisions = plan(state, lengths, groups=[0, 0, 0, 0])
    # The holder has finished: request 3 is prefilled and holds the prompt from now on.
    assert decisions.admitted == ((3, 0),) and decisions.shared == () and state.holders[0] == 3
    assert not set(state.pool.owned(3)) & set(state.pool.owned(2))
