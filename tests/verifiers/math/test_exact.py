"""The exact parser of constant answers: values, bounds and what it refuses."""

import fractions

import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from verifiers.math.exact import MAX_FACTORIAL, parse_constant


@pytest.mark.parametrize(
    "text, value",
    [
        ("-3", sympy.Integer(-3)),
        ("0.25", sympy.Rational(1, 4)),
        ("1e-7", sympy.Rational(1, 10**7)),
        ("2.5E3", sympy.Integer(2500)),
        (r"\frac{3}{4}", sympy.Rational(3, 4)),
        (r"\frac12", sympy.Rational(1, 2)),
        ("2^{-99}", sympy.Rational(1, 2**99)),
        ("1/2^99", sympy.Rational(1, 2**99)),
        ("3!", sympy.Integer(6)),
        ("1/2004!", 1 / sympy.factorial(2004)),
        (r"4\sqrt{2}", 4 * sympy.sqrt(2)),
        (r"4\sqrt(2)", 4 * sympy.sqrt(2)),  # parenthesised radicand is still a radicand
        (r"\sqrt[3]{8}", sympy.Integer(2)),
        ("8^{1/3}", sympy.Integer(2)),
        (r"\frac{\pi}{3}", sympy.pi / 3),
        (r"2\pi", 2 * sympy.pi),
        (r"3 \cdot 4 - 2 \times 5", sympy.Integer(2)),
        ("(1+2)(3)", sympy.Integer(9)),
    ],
)
def test_values(text, value):
    assert sympy.simplify(parse_constant(text) - value) == 0


@pytest.mark.parametrize(
    "text",
    ["x+1", "2 3", "(1,2)", r"\frac{1}{0}", "10^100000", "2^10^10", f"{MAX_FACTORIAL + 1}!", "", "1/", "0^{-1}"],
)
def test_outside_grammar_or_bounds_is_none(text):
    assert parse_constant(text) is None


def test_spec_false_positives_are_distinct():
    assert parse_constant("1/2004!") != parse_constant("1/2006!")
    assert parse_constant("1/2^99") != parse_constant("1/2^98")
    assert parse_constant("1e-7") != parse_constant("2e-7")
    assert parse_constant(r"4\sqrt(2)") != parse_constant("4")


@settings(max_examples=50)
@given(st.fractions(max_denominator=10**6))
def test_fractions_round_trip(f: fractions.Fraction):
    expected = sympy.Rational(f.numerator, f.denominator)
    assert parse_constant(f"{f.numerator}/{f.denominator}") == expected
    assert parse_constant(rf"\frac{{{f.numerator}}}{{{f.denominator}}}") == expected


@settings(max_examples=50)
@given(st.decimals(allow_nan=False, allow_infinity=False, places=6, min_value=-10**9, max_value=10**9))
def test_decimals_are_exact(d):
    assert parse_constant(str(d)) == sympy.Rational(str(d))
