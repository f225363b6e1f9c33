"""What a code problem is: its tests, checker, limits and language (plain values).

Three kinds of tests:

- ``IOTest``: stdin in, expected stdout out, compared by a named checker (one run per test).
- ``CallTest``: "write function f": ``f(*args, **kwargs)`` must return ``expected`` (plain data,
  compared outside the sandbox; floats within the problem's tolerance).
- ``CheckScript``: test code (HumanEval's ``check(candidate)``) run in a sandboxed process of
  its own, against a ``candidate`` whose calls the verifier relays to the sandboxed solution.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import Any

from verifiers.code import checkers, languages
from verifiers.code.limits import Limits
from verifiers.errors import ConfigError
from verifiers.files import read_capped

MAX_TESTS_FILE_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class IOTest:
    input: str
    output: str


@dataclasses.dataclass(frozen=True)
class CallTest:
    fn: str
    args: tuple = ()
    kwargs: tuple[tuple[str, Any], ...] = ()
    expected: Any = None


@dataclasses.dataclass(frozen=True)
class CheckScript:
    """Test code: ``setup`` (helpers, e.g. a HumanEval prompt) then ``test`` defining
    ``check(candidate)``, called with a proxy for the solution's ``entry_point``; sandboxed like
    the solution (see ``check_script``), and it must call the solution and run an ``assert``."""

    test: str
    entry_point: str
    setup: str = ""


Tests = tuple[IOTest, ...] | tuple[CallTest, ...] | CheckScript


@dataclasses.dataclass(frozen=True)
class CodeProblem:
    """Everything needed to judge programs for one problem.

    Attributes:
      tests: the IO tests, the call tests, or one check script.
      checker: for IO tests, a name in ``checkers.CHECKERS``.
      limits: the limits of each run (a check script's whole session is one run).
      language: a name in ``languages.LANGUAGES``.
      stop_early: stop at the first failing test (the reward is pass/fail either way).
      rel_tol, abs_tol: float tolerance of call-test results.
    """

    tests: Tests
    checker: str = "tokens"
    limits: Limits = Limits()
    language: str = "python"
    stop_early: bool = True
    rel_tol: float = 1e-9
    abs_tol: float = 0.0

    def __post_init__(self) -> None:
        checkers.get(self.checker)
        lang = languages.get(self.language)
        if isinstance(self.tests, CheckScript) or (self.tests and isinstance(self.tests[0], CallTest)):
            if not lang.calls:
                raise ConfigError(f"language {self.language!r} has no function-call harness; use IO tests")
        elif not isinstance(self.tests, tuple) or not all(isinstance(t, IOTest) for t in self.tests):
            raise ConfigError("tests must be IOTests, CallTests (not mixed) or one CheckScript")
        if isinstance(self.tests, tuple) and not self.tests:
            raise ConfigError("a code problem needs at least one test")
        if isinstance(self.tests, tuple) and isinstance(self.tests[0], CallTest):
            if not all(isinstance(t, CallTest) for t in self.tests):
                raise ConfigError("tests must be IOTests, CallTests (not mixed) or one CheckScript")
        for name in ("rel_tol", "abs_tol"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name}={value!r} must be a finite number >= 0")


def load_io_tests(path: str | pathlib.Path, max_bytes: int = MAX_TESTS_FILE_BYTES) -> tuple[IOTest, ...]:
    """IO tests from a JSONL file whose lines are ``{"input": "...", "output": "..."}``; a file
    over ``max_bytes`` (``/dev/zero`` included) is refused before it is parsed."""
    path = pathlib.Path(path)
    raw = read_capped(path, max_bytes, "tests file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"tests file {str(path)!r} is not UTF-8 text") from None
    tests = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            raise ConfigError(f"{path}:{number}: not a JSON object; expected "
                              '{"input": "...", "output": "..."}') from None
        if not (isinstance(obj, dict) and isinstance(obj.get("input"), str)
                and isinstance(obj.get("output"), str)):
            raise ConfigError(f"{path}:{number}: expected string fields \"input\" and \"output\"")
        try:
            (obj["input"] + obj["output"]).encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate escape such as "\ud800"
            raise ConfigError(f"{path}:{number}: a test holds an escape that is not a character") from None
        tests.append(IOTest(obj["input"], obj["output"]))
    if not tests:
        raise ConfigError(f"tests file {str(path)!r} holds no test")
    return tuple(tests)
