"""A calculator tool: exact arithmetic on a parsed expression, never ``eval``.

The expression is parsed with ``ast`` (``mode="eval"``) and walked: only numbers, ``+ - * / //
% **``, unary ``+ -`` and parentheses are accepted; a name, a call, an attribute or anything else
is an error result. Every bound is checked *before* the work it bounds: the expression's length,
a power's exponent and the size its result would have, and each intermediate result's digits, so
``9**9**9`` or ``10**10**10`` costs nothing. Integers stay exact (leading zeros allowed); ``/`` gives an integer when it
divides exactly, else a float.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import operator
import re
import time
from typing import Any

from runtime.episodes.tools import Status, ToolResult
from runtime.errors import UsageError

Number = int | float
MAX_BOUND = 4000
"""Largest bound a calculator accepts (Python prints integers of at most 4300 digits)."""


class CalcError(ValueError):
    """The expression is refused or fails (its message is shown to the model)."""


_LEADING_ZEROS = re.compile(r"(?<![\d.eE_])0+(?=\d)")
"""Leading zeros of an integer (``037+085`` as the sums task writes its operands), which Python refuses."""
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Mod: operator.mod,
           ast.FloorDiv: operator.floordiv}


@dataclasses.dataclass(frozen=True)
class Calculator:
    """Arithmetic on integers and decimals.

    Attributes:
      max_chars: longest expression accepted.
      max_exponent: largest absolute exponent of ``**``.
      max_digits: most decimal digits of any (intermediate) integer result.
    """

    max_chars: int = 200
    max_exponent: int = 1000
    max_digits: int = 100
    name: str = "calculator"

    def __post_init__(self) -> None:
        for field in ("max_chars", "max_exponent", "max_digits"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_BOUND:
                raise UsageError(f"calculator {field}={value!r} must be an integer in 1..{MAX_BOUND}")

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "max_chars": self.max_chars, "max_exponent": self.max_exponent,
                "max_digits": self.max_digits}

    def run(self, arguments: str) -> ToolResult:
        start = time.perf_counter()
        try:
            value = self.evaluate(arguments)
        except CalcError as e:
            return ToolResult.of(b"", 1, time.perf_counter() - start, Status.ERROR, str(e))
        return ToolResult.of(format_number(value).encode(), 0, time.perf_counter() - start, Status.OK)

    def evaluate(self, expression: str) -> Number:
        """The value of ``expression``; ``CalcError`` naming why it is refused."""
        text = expression.strip()
        if not text:
            raise CalcError("empty expression")
        if len(text) > self.max_chars:
            raise CalcError(f"expression longer than {self.max_chars} characters")
        try:
            tree = ast.parse(_LEADING_ZEROS.sub("", text), mode="eval")
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            raise CalcError("not an arithmetic expression") from None
        try:
            return self._value(tree.body)
        except RecursionError:
            raise CalcError("expression nested too deeply") from None

    def _check(self, value: Number) -> Number:
        if isinstance(value, float):
            if not math.isfinite(value):
                raise CalcError("result is not a finite number")
            return value
        if value.bit_length() > int(self.max_digits * 3.32) and len(str(abs(value))) > self.max_digits:
            raise CalcError(f"result has more than {self.max_digits} digits")
        return value

    def _value(self, node: ast.AST) -> Number:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                raise CalcError(f"only numbers are accepted, not {node.value!r}"[:80])
            return self._check(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
            value = self._value(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp):
            left, right = self._value(node.left), self._value(node.right)
            try:
                if isinstance(node.op, ast.Pow):
                    return self._check(self._power(left, right))
                if isinstance(node.op, ast.Div):
                    if right == 0:
                        raise CalcError("division by zero")
                    if isinstance(left, int) and isinstance(right, int) and left % right == 0:
                        return self._check(left // right)
                    return self._check(left / right)
                op = _BINARY.get(type(node.op))
                if op is None:
                    raise CalcError(f"operator {type(node.op).__name__} is not accepted")
                return self._check(op(left, right))
            except ZeroDivisionError:
                raise CalcError("division by zero") from None
            except OverflowError:
                raise CalcError("result too large") from None
        raise CalcError(f"{type(node).__name__} is not accepted: only numbers and + - * / // % ** ( )")

    def _power(self, base: Number, exponent: Number) -> Number:
        if abs(exponent) > self.max_exponent:
            raise CalcError(f"exponent larger than {self.max_exponent}")
        if isinstance(base, int) and isinstance(exponent, int) and exponent >= 0:
            # bits of the result, bounded before computing it: |base| < 2**bits(base)
            if abs(base) > 1 and (abs(base).bit_length() - 1) * exponent > self.max_digits * 3.33 + 4:
                raise CalcError(f"result has more than {self.max_digits} digits")
            return int(base**exponent)
        if base == 0 and exponent < 0:
            raise CalcError("division by zero")
        value = float(base) ** float(exponent)
        if isinstance(value, complex):
            raise CalcError("result is not a real number")
        return value


def format_number(value: Number) -> str:
    """An integer as its digits; a float with 12 significant digits (an integral float as an integer)."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return format(value, ".12g")
