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
