"""A user's own reward function, run in the code sandbox.

``verifier.reward = "my_reward.py"`` (or ``"my_reward.py:score"`` to name another function) names
a Python file whose function ``reward(prompt, completion, answer)`` takes the prompt text, the
completion text and the problem's reference answer (a string, or None when the problem has
none) and returns the completion's reward, a finite number. The file is the user's, but what it
reads is the model's output, so it runs where a program under test does: in the sandbox
(``verifiers.code``), under the call harness (``call_driver.py``), as one file with the standard
library only. One sandboxed process scores many completions, one call each; the values come
back as plain data built here.

Each completion gets an ``Outcome`` of verifier ``"reward"`` whose version is the file's sha256
(so the ledger records which source scored it) and whose ``credit`` is the number returned:
verdict ``AC`` from a reward of 1 or more (it counts as passed in pass rates), ``WA`` below.
A call that raises is ``RE``, one that runs out of time or memory ``TLE``/``MLE`` (reward 0, the
process restarted for the next completion), and a value that is not a finite number
``INTERNAL_ERROR`` (reward 0). :meth:`RewardVerifier.check` calls the function once before a run
starts, so a file that does not load, or a function that raises or returns something else, is
refused in one line naming the file before anything is trained.
"""

from __future__ import annotations

import ast
import concurrent.futures
import dataclasses
import hashlib
import math
import os
import time
from collections.abc import Sequence
from typing import Any

from verifiers.code import languages
from verifiers.code.calls import CallSession, SolutionFailed, failure_verdict
from verifiers.code.limits import Limits
from verifiers.code.sandbox import Sandbox
from verifiers.code.verify import driver_files
from verifiers.errors import ConfigError
from verifiers.outcome import Outcome, Verdict

VERIFIER = "reward"
DEFAULT_FUNCTION = "reward"
MAX_SOURCE_BYTES = 1 << 20
CALL_WALL_S = 5.0
"""Wall-clock seconds one call of the reward function may take (``TLE`` beyond)."""
CALL_CPU_S = 5.0
"""CPU seconds per call, summed over the calls a sandboxed process makes."""
PARAMETERS = "(prompt, completion, answer)"

Item = tuple[str, str, "str | None"]
"""One completion to score: (prompt, completion, answer)."""


def _refuse(spec: str, why: str) -> ConfigError:
    return ConfigError(f"verifier.reward {spec!r}: {why}")


def _takes_three(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    a = fn.args
    positional = len(a.posonlyargs) + len(a.args)
    required_kw = sum(d is None for d in a.kw_defaults)
    return (positional >= 3 or a.vararg is not None) and positional - len(a.defaults) <= 3 and required_kw == 0


def split_spec(spec: str) -> tuple[str, str]:
    """``FILE.py:FUNCTION`` as (file, function); a bare ``FILE.py`` calls ``reward``."""
    head, sep, tail = spec.rpartition(":")
    if sep and head.endswith(".py"):
        return head, tail
    return spec, DEFAULT_FUNCTION


@dataclasses.dataclass(frozen=True)
class RewardModule:
    """A reward file as read: its absolute path, the function to call, its source and sha256.

    Attributes:
      path: the file's absolute path.
      function: the name of the function called for each completion.
      source: the file's bytes, as they run in the sandbox.
      digest: sha256 of ``source`` in hex.
    """

    path: str
    function: str
    source: bytes
    digest: str

    @classmethod
    def load(cls, spec: str) -> RewardModule:
        """The module ``spec`` names (``FILE.py`` or ``FILE.py:FUNCTION``), read and checked
        without running it: a missing or unreadable file, a syntax error, or no top-level
        function of that name taking ``(prompt, completion, answer)`` is a one-line
        ``ConfigError`` naming the file."""
        path, function = split_spec(spec)
        if not path.endswith(".py") or not function.isidentifier():
            raise _refuse(spec, "give a Python file, FILE.py (its function reward is called) or FILE.py:FUNCTION")
        full = os.path.abspath(path)
        try:
            with open(full, "rb") as f:
                source = f.read(MAX_SOURCE_BYTES + 1)
        except FileNotFoundError:
            raise _refuse(spec, f"{full} does not exist") from None
        except OSError as e:
            raise _refuse(spec, f"{full} cannot be read: {e.strerror or e}") from None
        if len(source) > MAX_SOURCE_BYTES:
            raise _refuse(spec, f"{full} is larger than {MAX_SOURCE_BYTES >> 10} KiB")
        try:
            tree = ast.parse(source.decode("utf-8"), full)
        except UnicodeDecodeError as e:
            raise _refuse(spec, f"{full} is not UTF-8 text (byte {e.start})") from None
        except SyntaxError as e:
            raise _refuse(spec, f"{full} is not valid Python: line {e.lineno}: {e.msg}") from None
        defs = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == function]
        if not defs:
            raise _refuse(spec, f"{full} defines no function {function!r} at its top level; define "
                                f"{function}{PARAMETERS} returning a number")
        fn = defs[-1]
        if isinstance(fn, ast.AsyncFunctionDef) or not _takes_three(fn):
            raise _refuse(spec, f"{full}: {function} must be a plain function taking three arguments "
                                f"{PARAMETERS}")
        return cls(full, function, source, hashlib.sha256(source).hexdigest())

    @property
    def version(self) -> str:
        """The outcome's verifier version: the source's digest."""
        return f"sha256:{self.digest}"


def graded(module: RewardModule, value: Any, isolation: str) -> Outcome:
    """The outcome of a call of ``module``'s function that returned ``value``."""
    if type(value) not in (int, float) or not math.isfinite(value):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return Outcome(Verdict.INTERNAL_ERROR, f"{module.function} returned {shown} ({type(value).__name__}); it "
                       "must return a finite number", VERIFIER, module.version, isolation)
    credit = float(value)
    return Outcome(Verdict.AC if credit >= 1.0 else Verdict.WA, f"reward {credit!r}", VERIFIER, module.version,
                   isolation, credit=credit)


class RewardVerifier:
    """Scores completions with a user's reward function in ``sandbox``; safe from many threads."""

    def __init__(self, module: RewardModule, sandbox: Sandbox, *, call_wall_s: float = CALL_WALL_S):
        self.module = module
        self.sandbox = sandbox
        self.call_wall_s = call_wall_s

    def _limits(self, calls: int) -> Limits:
        return Limits(wall_s=self.call_wall_s * (calls + 1), cpu_s=CALL_CPU_S * (calls + 1))

    def _start(self, calls: int):
        files = {"solution.py": self.module.source, **driver_files()}
        return self.sandbox.start(languages.PYTHON_ARGV + ("call_driver.py",), files=files,
                                  limits=self._limits(calls))

    def _failed(self, verdict: Verdict, detail: str) -> Outcome:
        return Outcome(verdict, detail, VERIFIER, self.module.version, self.sandbox.level.value)

    def _score_run(self, items: Sequence[Item]) -> list[Outcome]:
        """Score ``items`` in order: one sandboxed process, restarted after a call that ended it."""
        fn, level = self.module.function, self.sandbox.level.value
        out: list[Outcome] = []
        while len(out) < len(items):
            with self._start(len(items) - len(out)) as live:
                try:
                    session = CallSession(live)
                except SolutionFailed as failure:  # the module does not load: nothing of it can score
                    verdict, detail = failure_verdict(live, failure, live.limits)
                    detail = detail.replace("the solution", os.path.basename(self.module.path))
                    return out + [self._failed(verdict, detail)] * (len(items) - len(out))
                while len(out) < len(items):
                    live.deadline = time.monotonic() + self.call_wall_s  # each call its own wall-clock limit
                    try:
                        value = session.call(fn, items[len(out)], {})
                    except SolutionFailed as failure:
                        verdict, detail = failure_verdict(live, failure, live.limits)
                        if failure.kind == "unserialisable":
                            verdict, detail = Verdict.INTERNAL_ERROR, f"{detail}; it must return a finite number"
                        elif verdict is Verdict.TLE:  # the run's own limit is the sum of its calls'
                            detail = f"{fn} ran past its limit of {self.call_wall_s:g} s per call"
                        out.append(self._failed(verdict, detail))
                        if failure.kind in ("raised", "unserialisable"):
                            continue
                        break  # the process is over: a new one for the rest
                    out.append(graded(self.module, value, level))
        return out

    def score(self, items: Sequence[Item]) -> list[Outcome]:
        """One outcome per (prompt, completion, answer), in order; the items are split into at most
        one contiguous share per sandbox slot, each scored by its own process."""
        if not items:
            return []
        shares = min(self.sandbox.slots, len(items))
        bounds = [len(items) * k // shares for k in range(shares + 1)]
        parts = [items[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
        with concurrent.futures.ThreadPoolExecutor(shares) as pool:
            return [o for part in pool.map(self._score_run, parts) for o in part]

    def check(self, item: Item) -> None:
        """Call the function once on ``item``; a module that does not load, or a call that does not
        return a finite number, is a one-line ``ConfigError`` naming the file and what happened."""
        (outcome,) = self._score_run([item])
        if outcome.verdict in (Verdict.AC, Verdict.WA):
            return
        raise _refuse(f"{self.module.path}:{self.module.function}",
                      f"{outcome.verdict.value} on a probe call {self.module.function}(prompt, "
                      f"completion=the reference answer, answer): {outcome.detail}")


__all__ = ["RewardModule", "RewardVerifier", "graded", "split_spec"]
