"""The retention decision: the newest N plus the pinned versions survive (I5)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.params import ParamStoreError, evictable


def test_example():
    # versions 0..6, keep the newest 2 (5, 6) and the pinned 1 and 3; 9 is pinned but unknown.
    assert evictable(range(7), keep_newest=2, pinned={1, 3, 9}) == (0, 2, 4)
    assert evictable([], keep_newest=1) == ()
    assert evictable([4, 4, 2], keep_newest=1) == (2,)


@given(
    versions=st.sets(st.integers(0, 40), max_size=25),
    pinned=st.sets(st.integers(0, 45), max_size=8),
    keep_newest=st.integers(1, 6),
)
def test_properties(versions, pinned, keep_newest):
    evicted = evictable(sorted(versions, reverse=True), keep_newest=keep_newest, pinned=pinned)
    assert list(evicted) == sorted(evicted)
    assert set(evicted) <= versions
    assert not set(evicted) & pinned  # I5: a pinned version is never evicted
    newest = sorted(versions)[-keep_newest:]
    assert not set(evicted) & set(newest)
    # Everything else goes: the kept set is exactly newest ∪ pinned.
    assert versions - set(evicted) == (set(newest) | pinned) & versions


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None])
def test_keep_newest_must_be_positive_int(bad):
    with pytest.raises(ParamStoreError, match=f"keep_newest={bad!r} is not accepted"):
        evictable([1, 2], keep_newest=bad)
