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
    """Equality of plain data with exact types, except that numbers compare as numbers and a
    float within ``max(rel_tol * |expected|, abs_tol)`` counts as equal (``bool`` is not a number
    here: ``True`` never equals ``1``)."""
    ta, te = type(actual), type(expected)
    if ta in (int, float) and te in (int, float) and (ta is float or te is float):
        if math.isnan(expected):
            return math.isnan(actual)
        if math.isinf(expected) or math.isinf(actual):
            return actual == expected
        return abs(actual - expected) <= max(rel_tol * abs(expected), abs_tol)
    if ta is not te:
        return False
    if ta in (list, tuple):
        return len(actual) == len(expected) and all(
            same_value(a, e, rel_tol, abs_tol) for a, e in zip(actual, expected)
        )
    if ta is dict:
        return actual.keys() == expected.keys() and all(
            same_value(actual[k], expected[k], rel_tol, abs_tol) for k in expected
        )
    return actual == expected
