"""The shell's copy of the payloads live work needs (tokens, outcomes, batches).

The controller state keeps ids and counters only; verifiers need completions and the trainer
needs whole batches, so the I/O loop keeps the events of live and formed-but-untrained
rollouts here, fed by every committed (or, on resume, every folded) event. Memory stays
bounded by the work in flight: entries leave when their group is discarded or their step is
trained.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ledger import events as ev


class RolloutCache:
    """Payload events of live rollouts, by rollout id; ``observe`` every event in ledger order."""

    def __init__(self) -> None:
        self.requests: dict[int, ev.SampleRequest] = {}
        self.completions: dict[int, ev.RolloutCompleted] = {}
        self.outcomes: dict[int, ev.OutcomeRecorded] = {}
        self.unscored: dict[int, None] = {}  # completion order
        self.batches: dict[int, ev.BatchFormed] = {}  # formed, untrained
        self._groups: dict[int, list[int]] = {}

    def _drop(self, rollout_ids) -> None:
        for rid in rollout_ids:
            self.requests.pop(rid, None)
            self.completions.pop(rid, None)
            self.outcomes.pop(rid, None)
            self.unscored.pop(rid, None)

    def observe(self, e: ev.Event) -> None:
        handler = _OBSERVERS.get(type(e))
        if handler is not None:
            handler(self, e)

    def _requested(self, e: ev.RolloutRequested) -> None:
        requests = self.requests
        for q in e.samples():
            requests[q.rollout_id] = q
        self._groups.setdefault(e.group_id, []).extend(e.rollout_ids)

    def _completed(self, e: ev.RolloutCompleted) -> None:
        self.completions[e.rollout_id] = e
        self.unscored[e.rollout_id] = None

    def _outcome(self, e: ev.OutcomeRecorded) -> None:
        self.outcomes[e.rollout_id] = e
        self.unscored.pop(e.rollout_id, None)

    def _discarded(self, e: ev.GroupDiscarded) -> None:
        self._drop(self._groups.pop(e.group_id, ()))

    def _formed(self, e: ev.BatchFormed) -> None:
        self.batches[e.step] = e
        for gid in e.group_ids:
            self._groups.pop(gid, None)

    def _trained(self, e: ev.TrainStepCompleted) -> None:
        batch = self.batches.pop(e.step, None)
        if batch is not None:
            self._drop(batch.rollout_ids)


# Each observer takes the cache and an event of its key's kind.
_OBSERVERS: dict[type, Callable[[RolloutCache, Any], None]] = {
    ev.RolloutRequested: RolloutCache._requested,
    ev.RolloutCompleted: RolloutCache._completed,
    ev.OutcomeRecorded: RolloutCache._outcome,
    ev.GroupDiscarded: RolloutCache._discarded,
    ev.BatchFormed: RolloutCache._formed,
    ev.TrainStepCompleted: RolloutCache._trained,
}
