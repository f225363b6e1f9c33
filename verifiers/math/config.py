"""How a math answer is judged: ``MathConfig``, with tolerances read by a bounded grammar.

A tolerance comes from users and the network (``--rel-tol``, a service request). Reading
``"1e6000000"`` with ``fractions.Fraction`` would build a six-million-digit integer, outside any
time bound, so a tolerance string must be a decimal of at most 40 digits with an exponent of at
most 3 digits, or ``p/q`` (what ``str(Fraction)`` writes, for the worker's round trip), and its
value 0 or within [1e-300, 1e9]; numbers and fractions are range-checked before any conversion.
"""

from __future__ import annotations

import dataclasses
import fractions
import re

from verifiers.errors import ConfigError

# a tolerance: a decimal of at most 40 digits with an exponent of at most 3 digits, or p/q
_TOLERANCE = re.compile(
    r"^\s*[-+]?(?:(?:\d{1,40}(?:\.\d{0,40})?|\.\d{1,40})(?:[eE][-+]?\d{1,3})?|\d{1,400}/\d{1,400})\s*$"
)
_NUMERIC = re.compile(r"^\s*[-+]?[\d.]+(?:[eE][-+]?\d*)?")  # looks like a number, maybe too long
MAX_TOLERANCE = 10**9
MIN_TOLERANCE = fractions.Fraction(1, 10**300)  # below it (but above 0) is a mistake


def _shown(value: object) -> str:
    """``value`` for an error message, short whatever its size."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"(an integer of {value.bit_length()} bits)"
    if isinstance(value, str) and len(value) > 60:
        return repr(value[:57] + "...")
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def read_tolerance(value: object, name: str) -> fractions.Fraction | None:
    """A tolerance read by a bounded grammar and range, so that no huge number is ever built."""
    if value is None:
        return None
    accepted = (
        f"give 0 or a number in [1e-300, {MAX_TOLERANCE:.0e}]: a decimal of at most 40 digits and a"
        " 3-digit exponent, or p/q (e.g. 1e-6, 1/1000)"
    )
    f: fractions.Fraction | None = None
    if isinstance(value, bool):
        pass
    elif isinstance(value, int):
        f = fractions.Fraction(value) if abs(value) <= MAX_TOLERANCE else None
    elif isinstance(value, float):
        f = fractions.Fraction(value) if abs(value) <= MAX_TOLERANCE else None  # nan fails too
    elif isinstance(value, fractions.Fraction):
        if max(value.numerator.bit_length(), value.denominator.bit_length()) <= 1400:
            f = value
    elif isinstance(value, str) and len(value) <= 810 and _TOLERANCE.match(value):
        try:
            f = fractions.Fraction(value.strip())
        except ZeroDivisionError:  # p/0
            f = None
    if f is not None and f < 0:
        raise ConfigError(f"{name} {_shown(value)} is negative; give a tolerance >= 0")
    numeric = isinstance(value, (int, float, fractions.Fraction)) or bool(_NUMERIC.match(str(value)[:100]))
    if f is None and (isinstance(value, bool) or not numeric):
        raise ConfigError(f"{name} {_shown(value)} is not a number; {accepted}")
    if f is None or f > MAX_TOLERANCE or 0 < f < MIN_TOLERANCE:
        raise ConfigError(f"{name} {_shown(value)} is out of range; {accepted}")
    return f


@dataclasses.dataclass(frozen=True)
class MathConfig:
    """How a math answer is judged.

    Attributes:
      extract: find the final answer in a free-form response (else the text is the answer).
      rel_tol: relative tolerance for numbers, exact rational (``"1e-6"``); None: exact.
      abs_tol: absolute tolerance for numbers; None: exact.
    """

    extract: bool = True
    rel_tol: fractions.Fraction | None = None
    abs_tol: fractions.Fraction | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "rel_tol", read_tolerance(self.rel_tol, "rel_tol"))
        object.__setattr__(self, "abs_tol", read_tolerance(self.abs_tol, "abs_tol"))
