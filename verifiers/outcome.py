"""The typed result of every verification: a verdict, never a magic score.

An ``Outcome`` says what was decided (``verdict``), why (``detail``), by which verifier and
version, under which isolation level, and per test when there were several. The RL reward is a
pure function of the verdict: ``reward = 1.0`` if the verdict is ``AC`` else ``0.0``, unless the
verifier grades (a user's reward function, ``verifiers.reward``): then it is the ``credit`` given.

Timings are measurements, not decisions: they are kept for logging and audit but excluded from
equality, so the same answer judged twice (or judged locally and by the service) compares equal.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any


class Verdict(str, enum.Enum):
    """What a verifier decided, in the order the sandbox checks them (OLE before TLE before MLE)."""

    AC = "AC"  # accepted: the answer or every test is right
    WA = "WA"  # wrong answer
    OLE = "OLE"  # output limit exceeded
    TLE = "TLE"  # time limit exceeded (wall clock or CPU), or a math parse timed out
    MLE = "MLE"  # memory limit exceeded
    RE = "RE"  # runtime error: non-zero exit, a signal, or the protocol broken by the program
    CE = "CE"  # compile error
    PARSE_ERROR = "PARSE_ERROR"  # no final answer could be found or parsed
    INTERNAL_ERROR = "INTERNAL_ERROR"  # the verifier could not judge (bad reference, no sandbox)


@dataclasses.dataclass(frozen=True)
class Timings:
    """Measured cost of a verification (wall-clock seconds); never part of a decision."""

    wall_s: float = 0.0

    def __add__(self, other: Timings) -> Timings:
        return Timings(wall_s=self.wall_s + other.wall_s)


@dataclasses.dataclass(frozen=True)
class TestResult:
    """The verdict on one test of a code problem."""

    __test__ = False  # not a pytest class

    index: int
    verdict: Verdict
    detail: str = ""
    timings: Timings = dataclasses.field(default_factory=Timings, compare=False)

    @property
    def passed(self) -> bool:
        return self.verdict is Verdict.AC


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The result of one verification.

    Attributes:
      verdict: what was decided.
      detail: one human-readable line saying why (deterministic: no measured times in it).
      verifier: the verifier's name, e.g. ``"math"`` or ``"code"``.
      version: the verifier's version; a change of judging rules changes it.
      isolation: for code, the sandbox isolation level that ran; empty for math.
      tests: per-test verdicts, in test order, up to the first failure when stopping early.
      timings: measured wall time (excluded from equality).
      credit: the reward a grading verifier gave (None: the verdict's, 1 for AC, else 0).
    """

    verdict: Verdict
    detail: str
    verifier: str
    version: str
    isolation: str = ""
    tests: tuple[TestResult, ...] = ()
    timings: Timings = dataclasses.field(default_factory=Timings, compare=False)
    credit: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.verdict, Verdict):
            object.__setattr__(self, "verdict", Verdict(self.verdict))

    @property
    def passed(self) -> bool:
        return self.verdict is Verdict.AC

    @property
    def reward(self) -> float:
        if self.credit is not None:
            return self.credit
        return 1.0 if self.passed else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: ``passed``, ``verdict`` and ``reward`` first, then the rest."""
        return {
            "passed": self.passed,
            "verdict": self.verdict.value,
            "reward": self.reward,
            "credit": self.credit,
            "detail": self.detail,
            "verifier": self.verifier,
            "version": self.version,
            "isolation": self.isolation,
            "timings": dataclasses.asdict(self.timings),
            "tests": [
                {
                    "index": t.index,
                    "passed": t.passed,
                    "verdict": t.verdict.value,
                    "detail": t.detail,
                    "timings": dataclasses.asdict(t.timings),
                }
                for t in self.tests
            ],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Outcome:
        """Inverse of ``to_dict`` (``passed`` and ``reward`` are derived, so they are ignored)."""
        return cls(
            verdict=Verdict(d["verdict"]),
            detail=d["detail"],
            verifier=d["verifier"],
            version=d["version"],
            isolation=d.get("isolation", ""),
            tests=tuple(
                TestResult(
                    index=t["index"],
                    verdict=Verdict(t["verdict"]),
                    detail=t["detail"],
                    timings=Timings(**t.get("timings", {})),
                )
                for t in d.get("tests", ())
            ),
            timings=Timings(**d.get("timings", {})),
            credit=d.get("credit"),
        )
