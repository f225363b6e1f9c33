"""The outcome of a replay: what was re-derived, whether it matched, and where it first did not."""

from __future__ import annotations

import dataclasses
from typing import Any

from runtime.replay.divergence import Divergence

SHOWN_DIVERGENCES = 20


@dataclasses.dataclass(frozen=True)
class ReplayReport:
    """What ``rlx replay`` found.

    Attributes:
      run_id: the replayed run.
      from_version: the version re-training started from (0: the rebuilt initial weights): the
        newest version the run kept at or before ``requested_version`` (``replay_start``).
      steps_total: train steps committed in the ledger.
      versions_verified: versions re-derived bit-exactly (version 0 included when
        ``from_version`` is 0).
      final_version: the newest version the replay derived (``from_version`` if it trained none).
      final_digest: its digest, or None if the replay stopped before deriving any.
      rollouts_regenerated: completions re-sampled (0 without ``--regenerate``).
      divergences: every disagreement found, in ledger order. Training stops at the first
        weights divergence (later versions would all differ); re-sampling and the parameter
        store check report each rollout and version.
      fingerprint_diff: fingerprint keys that differ from the ``RunStarted`` record.
      seconds: wall time of the replay (for reporting only).
      requested_version: the version asked for (``--from-version``).
      snapshots_checked: stored controller snapshots proven equal to the fold at their seq
        (``--check-snapshots``; 0 without it).
      episodes_rederived: multi-turn episodes re-derived from their sampled ids and recorded tool
        results, no tool run, equal to the record (0 for a run without tools).
      versions_held_max: the most versions (weights and optimizer state) the replay held at once:
        version 0, the newest, those later steps' rows were sampled from (and, re-sampling,
        those still to re-sample), not every version it derived.
    """

    run_id: str
    from_version: int
    steps_total: int
    versions_verified: int
    final_version: int | None
    final_digest: str | None
    rollouts_regenerated: int
    divergences: tuple[Divergence, ...]
    fingerprint_diff: dict[str, dict[str, Any]]
    seconds: float = 0.0
    requested_version: int = 0
    snapshots_checked: int = 0
    episodes_rederived: int = 0
    versions_held_max: int = 0

    @property
    def match(self) -> bool:
        """True when everything re-derived is bit-identical to the ledger."""
        return not self.divergences

    @property
    def first_divergence(self) -> Divergence | None:
        return self.divergences[0] if self.divergences else None

    def to_dict(self) -> dict[str, Any]:
        first = self.first_divergence
        return {
            "run_id": self.run_id,
            "match": self.match,
            "from_version": self.from_version,
            "requested_version": self.requested_version,
            "steps_total": self.steps_total,
            "versions_verified": self.versions_verified,
            "final_version": self.final_version,
            "final_digest": self.final_digest,
            "rollouts_regenerated": self.rollouts_regenerated,
            "snapshots_checked": self.snapshots_checked,
            "episodes_rederived": self.episodes_rederived,
            "versions_held_max": self.versions_held_max,
            "first_divergence": None if first is None else first.to_dict(),
            "divergence_count": len(self.divergences),
            "divergences": [d.to_dict() for d in self.divergences[:SHOWN_DIVERGENCES]],
            "fingerprint_differs": bool(self.fingerprint_diff),
            "fingerprint_diff": self.fingerprint_diff,
            "seconds": self.seconds,
        }


def ordered(divergences: list[Divergence]) -> tuple[Divergence, ...]:
    """Divergences in ledger order (by seq, then by stage), duplicates removed."""
    seen: dict[tuple, Divergence] = {}
    for d in divergences:
        seen.setdefault((d.seq, d.stage, d.field, d.rollout_id), d)
    return tuple(sorted(seen.values(), key=Divergence.sort_key))
