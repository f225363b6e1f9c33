"""The page allocator: null page, all-or-nothing grow, shared pages freed by their last owner."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from runtime.errors import UsageError
from runtime.inference.pages import NULL_PAGE, OutOfPages, PagePool, pages_for


def test_pages_for_rounds_up():
    assert [pages_for(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_grow_release_and_table_rows():
    pool = PagePool.create(num_pages=6, page_size=4)  # pages 1..5 allocatable
    assert pool.free == (1, 2, 3, 4, 5) and pool.capacity == 5
    a = pool.grow(7, 5)  # 5 tokens -> 2 pages
    assert a.owned(7) == (1, 2) and a.free == (3, 4, 5)
    assert pool.free == (1, 2, 3, 4, 5)  # the old value is untouched
    assert a.grow(7, 8) is a  # 8 tokens still fit in 2 pages
    b = a.grow(9, 1).grow(7, 9)
    assert b.owned(9) == (3,) and b.owned(7) == (1, 2, 4) and b.num_used == 4
    np.testing.assert_array_equal(b.table_row(7, 5), [1, 2, 4, NULL_PAGE, NULL_PAGE])
    np.testing.assert_array_equal(b.table_row(42, 2), [NULL_PAGE, NULL_PAGE])
    c = b.release(7)
    assert c.free == (1, 2, 4, 5) and c.owned(7) == () and c.owned(9) == (3,)


def test_grow_is_all_or_nothing():
    pool = PagePool.create(num_pages=4, page_size=2).grow(1, 3)  # 2 of 3 pages used
    with pytest.raises(OutOfPages, match="sequence 2 needs 2 more pages for 4 tokens; 1 of 3"):
        pool.grow(2, 4)
    assert pool.free == (3,) and pool.owned(2) == ()
    assert not pool.fits(2, 4) and pool.fits(2, 2)


def test_shared_pages_are_freed_by_their_last_owner():
    pool = PagePool.create(num_pages=8, page_size=4).grow(0, 10)  # 10 tokens: pages 1, 2, 3
    # Request 1 has the same first 8 tokens: it references pages 1 and 2 and gets its own third.
    both = pool.share(1, 0, 2).grow(1, 10)
    assert both.owned(1) == (1, 2, 4) and both.num_used == 4 and both.free == (5, 6, 7)
    assert dict(both.refs) == {1: 2, 2: 2, 3: 1, 4: 1}
    assert both.fits(1, 12) and both.shortfall(1, 13) == 1  # its shared pages count as held
    one = both.release(0)  # only page 3 was request 0's alone
    assert one.free == (3, 5, 6, 7) and one.owned(1) == (1, 2, 4) and dict(one.refs) == {1: 1, 2: 1, 4: 1}
    none = one.release(1)
    assert none.free == (1, 2, 4, 3, 5, 6, 7) and not none.tables and not none.refs
    assert pool.share(1, 0, 0) is pool  # nothing to share: the pool is unchanged
    with pytest.raises(ValueError, match="sequence 1 .holding 3 pages. cannot share 2 pages of sequence 0"):
        both.share(1, 0, 2)
    with pytest.raises(ValueError, match="cannot share 4 pages of sequence 0, which holds 3"):
        pool.share(1, 0, 4)


def test_release_of_a_sequence_without_pages_is_a_bug():
    with pytest.raises(KeyError, match="sequence 3 holds no pages"):
        PagePool.create(num_pages=3, page_size=2).release(3)


@pytest.mark.parametrize(
    "num_pages, page_size, message",
    [(1, 4, "num_pages=1 is not accepted; it must be an integer >= 2"),
     (8, 0, "page_size=0 is not accepted"), (True, 4, "num_pages=True"), (8, 2.0, "page_size=2.0")],
)
def test_bad_sizes_are_rejected(num_pages, page_size, message):
    with pytest.raises(UsageError, match=message):
        PagePool.create(num_pages=num_pages, page_size=page_size)


class PoolMachine(RuleBasedStateMachine):
    """Random grows and releases against a model of who holds how many tokens."""

    def __init__(self):
        super().__init__()
        self.pool = PagePool.create(num_pages=9, page_size=3)
        self.tokens: dict[int, int] = {}

    @rule(owner=st.integers(0, 4), extra=st.integers(0, 10))
    def grow(self, owner, extra):
        before = self.pool
        want = self.tokens.get(owner, 0) + extra
        need = pages_for(want, 3) - len(before.owned(owner))
        if need > before.num_free:
            with pytest.raises(OutOfPages):
                before.grow(owner, want)
            assert self.pool == before
            return
        self.pool = before.grow(owner, want)
        if want:
            self.tokens[owner] = want
        # Existing pages keep their logical positions; new ones come from the free list's front.
        assert self.pool.owned(owner)[: len(before.owned(owner))] == before.owned(owner)
        assert self.pool.owned(owner)[len(before.owned(owner)):] == before.free[: max(need, 0)]

    @rule(owner=st.integers(0, 4), source=st.integers(0, 4), pages=st.integers(0, 3))
    def share(self, owner, source, pages):
        before = self.pool
        if owner == source or before.owned(owner) or len(before.owned(source)) < pages:
            if pages and owner != source:
                with pytest.raises(ValueError):
                    before.share(owner, source, pages)
            return
        self.pool = before.share(owner, source, pages)
        assert self.pool.free == before.free  # sharing allocates nothing
        assert self.pool.owned(owner) == before.owned(source)[:pages]
        if pages:
            self.tokens[owner] = pages * 3

    @rule(owner=st.integers(0, 4))
    def release(self, owner):
        if owner not in self.pool.tables:
            with pytest.raises(KeyError):
                self.pool.release(owner)
            return
        pages = self.pool.owned(owner)
        others = {p for o, held in self.pool.tables.items() if o != owner for p in held}
        self.pool = self.pool.release(owner)
        self.tokens.pop(owner, None)
        # Exactly the pages nobody else holds are freed, in the owner's order, at the front.
        freed = tuple(p for p in pages if p not in others)
        assert self.pool.owned(owner) == () and self.pool.free[: len(freed)] == freed

    @invariant()
    def every_page_free_or_owned_and_counted(self):
        owned = {p for pages in self.pool.tables.values() for p in pages}
        assert sorted(list(owned) + list(self.pool.free)) == list(range(1, 9))  # nothing lost
        assert NULL_PAGE not in owned and NULL_PAGE not in self.pool.free
        owners = {p: sum(p in pages for pages in self.pool.tables.values()) for p in owned}
        assert dict(self.pool.refs) == owners
        assert all(len(set(pages)) == len(pages) for pages in self.pool.tables.values())

    @invariant()
    def each_owner_holds_exactly_its_tokens_pages(self):
        for owner, pages in self.pool.tables.items():
            assert len(pages) == pages_for(self.tokens.get(owner, 0), 3)


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=60, stateful_step_count=30)
