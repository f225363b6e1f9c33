"""The calculator: exact arithmetic, every bound checked before the work, never an exception."""

from __future__ import annotations

import pytest

from runtime.episodes import Calculator, Status
from runtime.errors import UsageError

CALC = Calculator()


@pytest.mark.parametrize(("expression", "expected"), [
    ("12*7+5", "89"),
    (" 37 + 85 ", "122"),
    ("037+085", "122"),  # the sums task's zero-padded operands
    ("0.05*100+1e02", "105"),
    ("7/2", "3.5"),
    ("8/2", "4"),  # exact division stays an integer
    ("7//2", "3"),
    ("-7%3", "2"),
    ("-3**2", "-9"),  # ** binds tighter than unary minus, as in Python
    ("2**-2", "0.25"),
    ("2**0.5", "1.41421356237"),
    ("(1+2)*(3+4)", "21"),
    ("2**300 // 2**299", "2"),
    ("1e3+1", "1001"),
])
def test_values(expression, expected):
    result = CALC.run(expression)
    assert result.status is Status.OK, result.detail
    assert result.output == expected.encode()
    assert result.exit_status == 0 and not result.truncated


@pytest.mark.parametrize(("expression", "why"), [
    ("", "empty expression"),
    ("1+" * 150 + "1", "longer than 200 characters"),
    ("9**9**9", "exponent larger than 1000"),
    ("10**10**10", "exponent larger than 1000"),
    ("2**999", "more than 100 digits"),  # 301 digits: refused before it is computed
    ("10**50 * 10**60", "more than 100 digits"),
    ("1/0", "division by zero"),
    ("5%0", "division by zero"),
    ("0**-1", "division by zero"),
    ("(-8)**0.5", "not a real number"),
    ("1e308*10", "not a finite number"),
    ("__import__('os').system('true')", "Call is not accepted"),
    ("x+1", "Name is not accepted"),
    ("(1).real", "Attribute is not accepted"),
    ("[1]*9", "List is not accepted"),
    ("'a'*9", "only numbers"),
    ("True+1", "only numbers"),
    ("1 if 1 else 2", "IfExp is not accepted"),
    ("1 < 2", "Compare is not accepted"),
    ("12*7)", "not an arithmetic expression"),
])
def test_refusals_are_error_results(expression, why):
    result = CALC.run(expression)
    assert result.status is Status.ERROR
    assert result.exit_status == 1 and result.output == b""
    assert why in result.detail
    assert result.text() == f"error: {result.detail}"


def test_limits_are_configurable_and_checked():
    small = Calculator(max_chars=5, max_exponent=3, max_digits=3)
    assert small.run("2**3").output == b"8"
    assert "exponent larger than 3" in small.run("2**4").detail
    assert "more than 3 digits" in small.run("999+1").detail
    assert "longer than 5" in small.run("1+1+1+1").detail
    with pytest.raises(UsageError, match="max_digits=0"):
        Calculator(max_digits=0)
    with pytest.raises(UsageError, match="max_exponent=10000"):
        Calculator(max_exponent=10_000)
