"""Judge a program with a check script (HumanEval's ``check(candidate)``), both sandboxed.

A check script is code too: it comes with the problem (over the network, for the verifier
service), so it never runs in the verifier's process. Two sandboxed processes, each with its own
uid, take part: the solution under ``call_driver.py`` and the check under ``check_driver.py``.
They never meet; the verifier relays each call of ``candidate`` from the check to the solution
and the result (plain data it decoded and re-encoded itself) back. So the solution cannot
subvert the check (another uid, another process, no shared file), and the check cannot reach
the host.

The verdict is decided here, from what each side did: the solution's failures are judged as for
call tests; the check's own report is trusted only as far as the problem's author is, because
the author wrote it. A check that proves nothing does not pass anything: the check must have
called the solution at least once (counted here, by the relay) and executed at least one
``assert`` statement of its test code (counted by the driver); otherwise the outcome is
``INTERNAL_ERROR`` (a broken reference, reward 0).
"""

from __future__ import annotations

import contextlib
import functools
import json
import pathlib
import threading
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager

from verifiers.code import languages, verdict, wire
from verifiers.code.calls import CallSession, SolutionFailed, failure_verdict
from verifiers.code.limits import Limits
from verifiers.code.problems import CheckScript, CodeProblem
from verifiers.code.sandbox import LiveRun, Sandbox
from verifiers.errors import ConfigError
from verifiers.outcome import TestResult, Timings, Verdict

# The check's run outlives every call it waits for: with twice the time limits, a slow solution
# hits its own limit (and is judged TLE) first.
CHECK_TIME_FACTOR = 2.0
_HERE = pathlib.Path(__file__).resolve().parent
_pair_locks: weakref.WeakKeyDictionary[Sandbox, threading.Lock] = weakref.WeakKeyDictionary()
_pair_locks_guard = threading.Lock()


@functools.cache
def _driver_files() -> dict[str, bytes]:
    return {name: (_HERE / name).read_bytes() for name in ("check_driver.py", "wire.py")}


def _pair_lock(sandbox: Sandbox) -> threading.Lock:
    """Taken while a judging holds one slot and waits for its second: with at most one such
    judging per sandbox, two of them can never each hold one slot and wait forever."""
    with _pair_locks_guard:
        return _pair_locks.setdefault(sandbox, threading.Lock())


def _message(line: bytes | None) -> dict | None:
    if line is None:
        return None
    try:
        message = wire.loads(line)
    except wire.WireError:
        return {}
    return message if isinstance(message, dict) else {}


def _call_of(message: dict) -> tuple[tuple, dict]:
    """The arguments of a ``call`` message; raises ``WireError`` if it is malformed."""
    call = message["call"]
    if not isinstance(call, dict):
        raise wire.WireError("a call is not an object")
    args, pairs = wire.decode(call.get("args")), wire.decode(call.get("kwargs"))
    if type(args) is not list or type(pairs) is not list or not all(
        type(p) is list and len(p) == 2 and type(p[0]) is str for p in pairs
    ):
        raise wire.WireError("malformed call arguments")
    return tuple(args), dict(pairs)


def _check_stopped(checker: LiveRun, limits: Limits) -> tuple[Verdict, str]:
    decided = verdict.classify(checker.result(), limits)
    if decided is not None:
        return decided[0], f"the check script: {decided[1]}"
    return Verdict.INTERNAL_ERROR, "the check script ended without reporting"


def _relay(checker: LiveRun, live: LiveRun, problem: CodeProblem, limits: Limits) -> tuple[Verdict, str]:
    """Forward the check's calls to the solution until the check reports; the verdict."""
    script = problem.tests
    assert isinstance(script, CheckScript)
    try:
        session = CallSession(live)
    except SolutionFailed as failure:
        return failure_verdict(live, failure, problem.limits)
    forwarded: SolutionFailed | None = None  # the last failure the check was told of
    while True:
        message = _message(checker.read_line())
        if message is None:
            return _check_stopped(checker, limits)
        if "call" in message:
            try:
                args, kwargs = _call_of(message)
            except (wire.WireError, RecursionError, TypeError):
                return Verdict.INTERNAL_ERROR, "the check script broke the check protocol"
            try:
                reply = {"ok": wire.encode(session.call(script.entry_point, args, kwargs))}
            except SolutionFailed as failure:
                if failure.kind not in ("raised", "unserialisable"):  # the session is over
                    return failure_verdict(live, failure, problem.limits)
                forwarded = failure
                reply = {"failed": str(failure)}
            checker.send(wire.dumps(reply))
        elif "done" in message:
            asserts = message["done"].get("asserts") if isinstance(message["done"], dict) else None
            if session.calls == 0:
                return Verdict.INTERNAL_ERROR, f"the check script never called {script.entry_point}"
            if type(asserts) is not int or asserts < 1:
                return Verdict.INTERNAL_ERROR, "the check script ran no assert statement"
            return Verdict.AC, f"check passed ({session.calls} calls)"
        elif "error" in message and isinstance(message["error"], dict):
            error = message["error"]
            if error.get("candidate") is True and forwarded is not None:
                return failure_verdict(live, forwarded, problem.limits)
            text = str(error.get("message", ""))[:200]
            if error.get("type") == "AssertionError":
                return Verdict.WA, f"check failed at call {session.calls}" + (f": {text}" if text else "")
            return Verdict.WA, f"check raised {str(error.get('type'))[:80]} at call {session.calls}"
        elif "load_error" in message:
            return Verdict.INTERNAL_ERROR, f"the check script failed to load: {str(message['load_error'])[:300]}"
        else:
            return Verdict.INTERNAL_ERROR, "the check script broke the check protocol"


def judge_check_script(
    sandbox: Sandbox, problem: CodeProblem, start_solution: Callable[[], AbstractContextManager[LiveRun]]
) -> TestResult:
    """Run ``problem``'s check script in its own sandboxed process against the solution that
    ``start_solution`` starts (under the call driver); one ``TestResult`` for the whole check."""
    script = problem.tests
    assert isinstance(script, CheckScript)
    if sandbox.slots < 2:
        raise ConfigError(
            f"a check script needs a sandbox with at least 2 slots (it runs in its own sandboxed "
            f"process next to the solution); this one has {sandbox.slots}"
        )
    limits = problem.limits.scaled(CHECK_TIME_FACTOR)
    spec = json.dumps({"setup": script.setup, "test": script.test, "entry_point": script.entry_point})
    files = {**_driver_files(), "check.json": spec.encode("utf-8", "surrogateescape")}
    with contextlib.ExitStack() as stack:
        with _pair_lock(sandbox):
            checker = stack.enter_context(
                sandbox.start(languages.PYTHON_ARGV + ("check_driver.py",), files=files, limits=limits)
            )
            live = stack.enter_context(start_solution())
        verdict_, detail = _relay(checker, live, problem, limits)
        run = live.result()
    return TestResult(0, verdict_, detail, Timings(wall_s=run.wall_s))
