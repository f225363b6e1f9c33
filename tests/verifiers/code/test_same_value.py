"""The call-test comparator ``same_value``: exact types, numbers as numbers, tolerance for floats."""


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verifiers.code import wire
from verifiers.code.calls import same_value

NAN = float("nan")

EQUAL = [
    (1, 1, 0.0),
    (2.0, 2, 0.0),  # an int expected value accepts a float of exactly that value
    (float(10**12), 10**12, 1e-9),
    (10**400, 10**400, 1e-9),
    (0.1 + 0.2, 0.3, 1e-9),
    (3, 3.0, 0.0),  # an int within a float's tolerance
    (NAN, NAN, 0.0),
    (float("inf"), float("inf"), 0.0),
    ({NAN}, {float("nan")}, 0.0),  # a set holding nan equals itself
    (frozenset({NAN, 1}), frozenset({float("nan"), 1}), 0.0),
    ({NAN: "x"}, {float("nan"): "x"}, 0.0),
    ({1.0}, {1}, 0.0),  # set members compare as numbers, exactly
    ({"a": 0.1 + 0.2}, {"a": 0.3}, 1e-9),  # dict values use the tolerance
    ([1, (2.0, "a")], [1, (2, "a")], 0.0),
    ({(1, True): [None]}, {(1.0, True): [None]}, 0.0),
    ({frozenset({True})}, {frozenset({True})}, 0.0),
    (b"ab", b"ab", 0.0),
]

DIFFERENT = [
    (True, 1, 0.0),
    (1, True, 0.0),
    ({True: "x"}, {1: "x"}, 0.0),  # a bool key is not an int key
    ({1: "x"}, {True: "x"}, 0.0),
    ({True}, {1}, 0.0),  # a bool member is not an int member
    (frozenset({1}), frozenset({True}), 0.0),
    ({(True,)}, {(1,)}, 0.0),
    ([{True}], [{1}], 0.0),
    ({"k": True}, {"k": 1}, 0.0),
    (1e12 + 999.0, 10**12, 1e-9),  # no tolerance for an int expected value
    (10**12 + 1, 10**12, 1e-9),
    (2.5, 2, 0.5),
    (10**400, 1.5, 1e-9),  # an int beyond a float's range
    (0.1 + 0.2, 0.3, 0.0),
    (NAN, 1.0, 1.0),
    (1.0, NAN, 1.0),
    (NAN, 1, 0.0),
    (float("inf"), 1e308, 1.0),
    ({0.1 + 0.2}, {0.3}, 1e-9),  # members compare exactly
    ({NAN}, {1.0}, 0.0),
    ({NAN: 1, float("nan"): 2}, {NAN: 1, float("nan"): 3}, 0.0),
    ((1, 2), [1, 2], 0.0),
    ({1}, frozenset({1}), 0.0),
    ({"a": 1}, {"a": 1, "b": 2}, 0.0),
    ("1", 1, 0.0),
    (None, 0, 0.0),
]


@pytest.mark.parametrize("actual, expected, rel_tol", EQUAL)
def test_equal_values(actual, expected, rel_tol):
    assert same_value(actual, expected, rel_tol, 0.0)


@pytest.mark.parametrize("actual, expected, rel_tol", DIFFERENT)
def test_different_values(actual, expected, rel_tol):
    assert not same_value(actual, expected, rel_tol, 0.0)


def test_abs_tol_for_floats_only():
    assert same_value(1.05, 1.0, 0.0, 0.1)
    assert not same_value(1.05, 1, 0.0, 0.1)


scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=3)
hashables = st.recursive(
    scalars, lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3), max_leaves=8
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3)
    | st.tuples(inner, inner)
    | st.dictionaries(hashables, inner, max_size=3)
    | st.sets(hashables, max_size=3),
    max_leaves=12,
)


@settings(max_examples=200)
@given(values)
def test_a_value_equals_its_wire_copy(value):
    """What crosses the wire equals what was sent, nan and sets of nan included."""
    assert same_value(wire.decode(wire.encode(value)), value, 0.0, 0.0)


def _swap_bools(value):
    t = type(value)
    if t is bool:
        return int(value)
    if t in (list, tuple):
        return t(_swap_bools(v) for v in value)
    if t in (set, frozenset):
        return t(_swap_bools(v) for v in value)
    if t is dict:
        return {_swap_bools(k): _swap_bools(v) for k, v in value.items()}
    return value


def _has_bool(value) -> bool:
    t = type(value)
    if t is bool:
        return True
    if t in (list, tuple, set, frozenset):
        return any(_has_bool(v) for v in value)
    if t is dict:
        return any(_has_bool(k) or _has_bool(v) for k, v in value.items())
    return False


@settings(max_examples=200)
@given(values)
def test_bools_never_stand_for_ints(value):
    """Replacing every bool by its int, anywhere, makes a different value."""
    swapped = _swap_bools(value)
    if _has_bool(value):
        assert not same_value(swapped, value, 1.0, 1.0)
        assert not same_value(value, swapped, 1.0, 1.0)


@settings(max_examples=200)
@given(st.integers(min_value=-(10**30), max_value=10**30), st.floats(allow_nan=False))
def test_int_expected_needs_the_exact_number(n, x):
    assert same_value(x, n, 1e-3, 1e-3) == (x == n)
