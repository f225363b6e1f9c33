"""Per-prompt pass rates over a run's rollout rows, and the band of pass rates curation keeps.

RLAX-style dataset curation keeps the prompts a policy sometimes solves: a prompt every sample
passes, or none does, gives a group of equal rewards and no advantage to learn from.
:class:`PromptStats` turns rollout rows (:class:`~ledger.pipelines.rollouts.RolloutRows`) into
one statistics row per prompt index; :class:`PassBand` says which rows a curated dataset keeps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import apache_beam as beam

from ledger.errors import LedgerError


@dataclasses.dataclass(frozen=True)
class VersionRange:
    """Policy versions ``first ..= last`` (None: unbounded on that side)."""

    first: int | None = None
    last: int | None = None

    @classmethod
    def parse(cls, text: str | None) -> VersionRange:
        """``"A:B"``, ``"A:"``, ``":B"`` or ``"V"`` (only V); None or ``":"``: every version."""
        if text is None:
            return cls()
        parts = text.split(":")
        if len(parts) > 2:
            raise LedgerError(f"--versions {text!r} is not accepted: give A:B, A:, :B or V (policy versions)")
        if len(parts) == 1:
            parts = [parts[0], parts[0]]
        bounds: list[int | None] = []
        for p in parts:
            p = p.strip()
            if not p:
                bounds.append(None)
                continue
            try:
                v = int(p)
            except ValueError:
                raise LedgerError(f"--versions {text!r} is not accepted: {p!r} is not a version number") from None
            if v < 0:
                raise LedgerError(f"--versions {text!r} is not accepted: versions are >= 0")
            bounds.append(v)
        first, last = bounds
        if first is not None and last is not None and first > last:
            raise LedgerError(f"--versions {text!r} is empty: {first} > {last}")
        return cls(first, last)

    def __contains__(self, version: int) -> bool:
        return (self.first is None or version >= self.first) and (self.last is None or version <= self.last)

    def describe(self) -> str:
        if self.first is None and self.last is None:
            return "all"
        return f"{'' if self.first is None else self.first}:{'' if self.last is None else self.last}"


@dataclasses.dataclass(frozen=True)
class PassBand:
    """The pass rates a curated dataset keeps.

    ``low`` given: keep ``rate >= low``; None: keep ``rate > 0`` (drop never-solved prompts).
    ``high`` given: keep ``rate <= high``; None: keep ``rate < 1`` (drop always-solved prompts).
    The defaults keep exactly the prompts with mixed outcomes; ``low=0, high=1`` keeps every
    prompt with at least one scored rollout. A prompt without a scored rollout has no pass rate
    and is never kept.
    """

    low: float | None = None
    high: float | None = None

    def __post_init__(self) -> None:
        for name, v in (("--min-pass", self.low), ("--max-pass", self.high)):
            if v is not None and not (isinstance(v, (int, float)) and 0.0 <= v <= 1.0):
                raise LedgerError(f"{name} {v!r} is not accepted: a pass rate is in [0, 1]")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise LedgerError(f"--min-pass {self.low} is above --max-pass {self.high}: no prompt could be kept")

    @classmethod
    def parse(cls, low: str | None, high: str | None) -> PassBand:
        """From command-line text, with one-line errors."""
        def number(name: str, text: str | None) -> float | None:
            if text is None:
                return None
            try:
                return float(text)
            except ValueError:
                raise LedgerError(f"{name} {text!r} is not accepted: give a pass rate in [0, 1]") from None

        return cls(number("--min-pass", low), number("--max-pass", high))

    def keeps(self, rate: float | None) -> bool:
        if rate is None:
            return False
        above = rate > 0.0 if self.low is None else rate >= self.low
        below = rate < 1.0 if self.high is None else rate <= self.high
        return above and below


class _PromptTotals(beam.CombineFn):
    """Sampled, scored and passed rollouts, reward sum and versions of one prompt."""

    def create_accumulator(self) -> tuple:
        return (0, 0, 0, 0.0, frozenset())

    def add_input(self, acc: tuple, row: dict) -> tuple:
        sampled, scored, passed, reward, versions = acc
        if row["reward"] is not None:
            scored += 1
            passed += bool(row["passed"])
            reward += row["reward"]
        return (sampled + 1, scored, passed, reward, versions | {row["policy_version"]})

    def merge_accumulators(self, accs: Iterable[tuple]) -> tuple:
        out = self.create_accumulator()
        for a in accs:
            out = (out[0] + a[0], out[1] + a[1], out[2] + a[2], out[3] + a[3], out[4] | a[4])
        return out

    def extract_output(self, acc: tuple) -> tuple:
        return acc


def _prompt_row(run_id: str, index: int, totals: tuple, band: PassBand) -> dict:
    sampled, scored, passed, reward, versions = totals
    rate = passed / scored if scored else None
    return {"run_id": run_id, "prompt_index": index, "sampled": sampled, "rollouts": scored, "passed": passed,
            "pass_rate": rate, "mean_reward": reward / scored if scored else None,
            "versions": sorted(versions), "kept": band.keeps(rate)}


class PromptStats(beam.PTransform):
    """Rollout rows → one row per prompt index sampled from ``versions``: ``sampled`` (requested
    rollouts), ``rollouts`` (those with an outcome: the pass rate's denominator), ``passed``,
    ``pass_rate`` (None without an outcome), ``mean_reward``, the policy ``versions`` that
    sampled it, and whether ``band`` ``kept`` it. An outcome counts once (the first recorded).
    """

    def __init__(self, run_id: str, versions: VersionRange | None = None, band: PassBand | None = None) -> None:
        super().__init__()
        self.run_id, self.versions, self.band = run_id, versions or VersionRange(), band or PassBand()

    def expand(self, rows):
        versions, run_id, band = self.versions, self.run_id, self.band
        return (rows
                | "FromVersions" >> beam.Filter(lambda r: r["policy_version"] in versions)
                | "ByPrompt" >> beam.Map(lambda r: (r["prompt_index"], r))
                | "PromptTotals" >> beam.CombinePerKey(_PromptTotals())
                | "PromptRow" >> beam.Map(lambda kv: _prompt_row(run_id, kv[0], kv[1], band)))
