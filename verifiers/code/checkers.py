"""Output checkers: pure functions run outside the sandbox, on bytes the program printed.

A checker compares a program's stdout with the expected output and says whether it is right, with
a one-line reason when it is not. Expected outputs never enter the sandbox.

- ``exact``: byte equality after normalising line ends (CRLF to LF) and trailing newlines.
- ``tokens``: equality of the whitespace-separated token sequences.
- ``float``: tokens equal, or both numbers with ``|a - b| <= max(rel_tol * |b|, abs_tol)``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from verifiers.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Check:
    ok: bool
    reason: str = ""


def _preview(data: bytes | str, limit: int = 40) -> str:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return repr(text if len(text) <= limit else text[:limit] + "...")


def exact(actual: bytes, expected: bytes) -> Check:
    """Equal bytes, ignoring CRLF versus LF and trailing newlines."""
    a = actual.replace(b"\r\n", b"\n").rstrip(b"\n")
    e = expected.replace(b"\r\n", b"\n").rstrip(b"\n")
    if a == e:
        return Check(True)
    at = next((i for i, (x, y) in enumerate(zip(a, e, strict=False)) if x != y), min(len(a), len(e)))
    return Check(False, f"output differs at byte {at}: got {_preview(a[at:])}, expected {_preview(e[at:])}")


def tokens(actual: bytes, expected: bytes) -> Check:
    """Equal sequences of whitespace-separated tokens."""
    a, e = actual.split(), expected.split()
    for i, (x, y) in enumerate(zip(a, e, strict=False)):
        if x != y:
            return Check(False, f"token {i}: got {_preview(x)}, expected {_preview(y)}")
    if len(a) != len(e):
        return Check(False, f"got {len(a)} tokens, expected {len(e)}")
    return Check(True)


def _number(token: bytes) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def floats(rel_tol: float = 1e-6, abs_tol: float = 1e-6) -> Callable[[bytes, bytes], Check]:
    """A token checker that accepts numbers within ``max(rel_tol * |expected|, abs_tol)``."""
    for name, value in (("rel_tol", rel_tol), ("abs_tol", abs_tol)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ConfigError(f"float checker {name}={value!r} must be a finite number >= 0")

    def check(actual: bytes, expected: bytes) -> Check:
        a, e = actual.split(), expected.split()
        if len(a) != len(e):
            return Check(False, f"got {len(a)} tokens, expected {len(e)}")
        for i, (x, y) in enumerate(zip(a, e, strict=False)):
            if x == y:
                continue
            xv, yv = _number(x), _number(y)
            if xv is None or yv is None:
                return Check(False, f"token {i}: got {_preview(x)}, expected {_preview(y)}")
            if abs(xv - yv) > max(rel_tol * abs(yv), abs_tol):
                return Check(False, f"token {i}: {xv!r} is not within tolerance of {yv!r}")
        return Check(True)

    return check


CHECKERS: dict[str, Callable[[bytes, bytes], Check]] = {
    "exact": exact,
    "tokens": tokens,
    "float": floats(),
}


def get(name: str) -> Callable[[bytes, bytes], Check]:
    """The checker registered as ``name``."""
    try:
        return CHECKERS[name]
    except KeyError:
        raise ConfigError(f"checker {name!r} is not one of: {', '.join(sorted(CHECKERS))}") from None
