"""The shell's copy of the payloads live work needs (tokens, outcomes, batches).

The controller state keeps ids and counters only; verifiers need completions and the trainer
needs whole batches, so the I/O loop keeps the events of live and formed-but-untrained
rollouts here, fed by every committed (or, on resume, every folded) event. Memory stays
bounded by the work in flight: entries leave when their group is discarded or their step is
trained.
"""

from __future__ import annotations

from ledger import events as ev


class RolloutCache:
    """Payload events of live rollouts, by rollout id; ``observe`` every event in ledger order."""

    def __init__(self) -> None:
        self.requests: dict[int, ev.RolloutRequested] = {}
        self.completions: dict[int, ev.RolloutCompleted] = {}
        self.outcomes: dict[int, ev.OutcomeRecorded] = {}
        self.unscored: dict[int, None] = {}  # completion order
        self.batches: dict[int, ev.BatchFormed] = {}  # formed, untrained
        self.versions: dict[int, str] = {}
        self._groups: dict[int, list[int]] = {}

    def _drop(self, rollout_ids) -> None:
        for rid in rollout_ids:
            self.requests.pop(rid, None)
            self.completions.pop(rid, None)
            self.outcomes.pop(rid, None)
            self.unscored.pop(rid, None)

    def observe(self, e: ev.Event) -> None:
        kind = type(e)
        if kind is ev.RolloutRequested:
            self.requests[e.rollout_id] = e
            self._groups.setdefault(e.group_id, []).append(e.rollout_id)
        elif kind is ev.RolloutCompleted:
            self.completions[e.rollout_id] = e
            self.unscored[e.rollout_id] = None
        elif kind is ev.OutcomeRecorded:
            self.outcomes[e.rollout_id] = e
            self.unscored.pop(e.rollout_id, None)
        elif kind is ev.GroupDiscarded:
            self._drop(self._groups.pop(e.group_id, ()))
        elif kind is ev.BatchFormed:
            self.batches[e.step] = e
            for gid in e.group_ids:
                self._groups.pop(gid, None)
        elif kind is ev.TrainStepCompleted:
            batch = self.batches.pop(e.step, None)
            if batch is not None:
                self._drop(batch.rollout_ids)
        elif kind is ev.WeightsPublished:
            self.versions[e.version] = e.digest
        elif kind is ev.VersionsRetired:
            for v in e.versions:
                self.versions.pop(v, None)
