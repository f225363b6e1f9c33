"""The function-call harness, outside half: call a sandboxed solution and judge the results here.

``CallSession`` talks to ``call_driver.py`` in a live sandboxed run; each call's result comes back
as wire data, so the values compared here are builtin types the verifier built itself (an object
with a permissive ``__eq__`` cannot come out). ``same_value`` compares call-test results;
``failure_verdict`` judges a call that failed. Check scripts run in a sandbox of their own
(``check_script``), never in this process.
"""

from __future__ import annotations

import math
from typing import Any

from verifiers.code import verdict, wire
from verifiers.code.limits import Limits
from verifiers.code.sandbox import LiveRun
from verifiers.outcome import Verdict


class SolutionFailed(Exception):
    """The solution raised, returned something that is not plain data, or broke the protocol."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind  # "raised", "unserialisable", "load_error", "protocol", "ended"


class CallSession:
    """Calls into a sandboxed solution, one request line and one reply line at a time."""

    def __init__(self, live: LiveRun):
        self.live = live
        self.calls = 0
        reply = self._receive()
        if "load_error" in reply:
            raise SolutionFailed("load_error", str(reply["load_error"]))
        if reply.get("ready") is not True:
            raise SolutionFailed("protocol", "the solution broke the call protocol while loading")

    def _receive(self) -> dict:
        line = self.live.read_line()
        if line is None:
            raise SolutionFailed("ended", f"the program ended before answering call {self.calls}")
        try:
            reply = wire.loads(line)
        except wire.WireError:
            reply = None
        if not isinstance(reply, dict):
            raise SolutionFailed("protocol", "the solution broke the call protocol")
        return reply

    def call(self, fn: str, args: tuple, kwargs: dict[str, Any]) -> Any:
        """``fn(*args, **kwargs)`` in the sandbox; its result as plain data built here."""
        self.calls += 1
        try:
            request = wire.dumps({
                "fn": fn,
                "args": wire.encode(list(args)),
                "kwargs": wire.encode([[k, v] for k, v in kwargs.items()]),
            })
        except wire.WireError as e:
            raise ValueError(f"call {self.calls} of {fn}: the test passes {e}") from None
        self.live.send(request)
        reply = self._receive()
        if "ok" in reply:
            try:
                return wire.decode(reply["ok"])
            except (wire.WireError, RecursionError):
                raise SolutionFailed("protocol", "the solution broke the call protocol") from None
        if "raised" in reply:
            raise SolutionFailed("raised", f"{fn} raised {str(reply['raised'])[:300]}")
        if "unserialisable" in reply:
            raise SolutionFailed("unserialisable", f"{fn} returned {str(reply['unserialisable'])[:300]}")
        raise SolutionFailed("protocol", "the solution broke the call protocol")


def failure_verdict(live: LiveRun, failure: SolutionFailed, limits: Limits) -> tuple[Verdict, str]:
    """The verdict of a call that failed: by the reply if the session is sound, else by the run."""
    if failure.kind == "unserialisable":
        return Verdict.WA, str(failure)
    if failure.kind == "load_error":
        kind = Verdict.CE if str(failure).startswith("SyntaxError") else Verdict.RE
        return kind, f"the solution failed to load: {failure}"
    if failure.kind == "ended":  # the run is over: its own verdict (TLE, MLE, ...) comes first
        decided = verdict.classify(live.result(), limits)
        if decided is not None:
            return decided
    return Verdict.RE, str(failure)


def same_value(actual: Any, expected: Any, rel_tol: float, abs_tol: float) -> bool:
    """Equality of plain data with exact types, except that numbers compare as numbers.

    - ``bool`` is not a number here: ``True`` never equals ``1``, at any depth (in lists, dict
      keys and values, set members).
    - An expected ``float`` accepts an ``int`` or ``float`` within
      ``max(rel_tol * |expected|, abs_tol)``; ``nan`` accepts only ``nan``, an infinity only itself.
    - An expected ``int`` needs exactly that number: an ``int``, or a ``float`` of exactly that
      value (``2.0`` for ``2``); no tolerance, so ``1e12 + 999.0`` is not ``10**12``.
    - Dict keys and set members compare exactly (numbers by value, ``nan`` equal to ``nan``), not
      within a tolerance: they identify entries. Containers need the same type (a tuple is not a
      list, a set is not a frozenset).
    """
    ta, te = type(actual), type(expected)
    if ta in (int, float) and te in (int, float):
        if te is int:
            return actual == expected  # exact, also for an int beyond a float's range
        if math.isnan(expected):
            return ta is float and math.isnan(actual)
        if math.isinf(expected) or (ta is float and math.isinf(actual)):
            return actual == expected
        try:
            return abs(actual - expected) <= max(rel_tol * abs(expected), abs_tol)
        except OverflowError:  # an int beyond a float's range is no finite float's neighbour
            return False
    if ta is not te:
        return False
    if ta in (list, tuple):
        return len(actual) == len(expected) and all(
            same_value(a, e, rel_tol, abs_tol) for a, e in zip(actual, expected, strict=False)
        )
    if ta is dict:
        return _same_dict(actual, expected, rel_tol, abs_tol)
    if ta in (set, frozenset):
        return _key_counts(actual) == _key_counts(expected)
    return actual == expected


def _key(value: Any) -> tuple:
    """A hashable, type-tagged identity of a dict key or set member for exact comparison:
    ``True`` and ``1`` differ, ``1`` and ``1.0`` agree, every ``nan`` agrees with every ``nan``."""
    t = type(value)
    if t is bool or value is None:
        return ("const", value)
    if t is float and math.isnan(value):
        return ("nan",)
    if t in (int, float):
        return ("number", value)
    if t is tuple:
        return ("tuple", tuple(_key(v) for v in value))
    if t is frozenset:
        return ("frozenset", frozenset(_key_counts(value).items()))
    return (t.__name__, value)


def _key_counts(values: Any) -> dict[tuple, int]:
    counts: dict[tuple, int] = {}
    for v in values:
        k = _key(v)
        counts[k] = counts.get(k, 0) + 1
    return counts


def _same_dict(actual: dict, expected: dict, rel_tol: float, abs_tol: float) -> bool:
    """Same keys (exactly, see ``_key``) and, key by key, the same values. Several keys that
    agree under ``_key`` (only distinct ``nan`` objects can) must match each other's values."""
    groups: dict[tuple, tuple[list, list]] = {}
    for side, d in ((0, actual), (1, expected)):
        for k, v in d.items():
            groups.setdefault(_key(k), ([], []))[side].append(v)
    for got, want in groups.values():
        if len(got) != len(want):
            return False
        if len(want) == 1:
            if not same_value(got[0], want[0], rel_tol, abs_tol):
                return False
        elif not (all(any(same_value(a, e, rel_tol, abs_tol) for e in want) for a in got)
                  and all(any(same_value(a, e, rel_tol, abs_tol) for a in got) for e in want)):
            return False
    return True

