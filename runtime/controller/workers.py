"""What workers receive from the controller and the interfaces they implement.

Workers are stateless consumers that pull work: an inference worker joins with a number of
slots, polls its leases and submits completions; a verifier asks for completed rollouts to score;
the trainer asks for the next step (``ControllerLoop``'s calls). The work items are named tuples: the controller builds hundreds
per step. A worker that dies simply stops calling: its leases expire, the
requests go to other workers, and a late or duplicate submission is answered with a rejection.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from ledger.events import (
    BatchFormed,
    OutcomeRecorded,
    RolloutCompleted,
    SampleRequest,
)

INFERENCE = "inference"
VERIFIER = "verifier"
TRAINER = "trainer"
ROLES = (INFERENCE, VERIFIER, TRAINER)


class Lease(NamedTuple):
    """One rollout to generate: a pure function of (weights, prompt, sampling, seed).

    Submit the result as ``RolloutCompleted(rollout_id, worker_id, attempt, policy_version,
    weights_digest, tokens, logprobs, finish_reason)``.
    """

    rollout_id: int
    attempt: int
    group_id: int
    batch: int
    ordinal: int
    prompt_index: int
    policy_version: int
    weights_digest: str
    seed: int
    sampling: dict


class ScoreTask(NamedTuple):
    """A completed rollout to verify; answer with ``OutcomeRecorded(rollout_id, …)``."""

    rollout_id: int
    prompt_index: int
    completion: RolloutCompleted


class TrainRollout(NamedTuple):
    """One rollout of a training batch with everything the trainer needs."""

    request: SampleRequest
    completion: RolloutCompleted
    outcome: OutcomeRecorded


class TrainTask(NamedTuple):
    """Train step ``step``: load version ``step - 1`` and its optimizer state, consume the batch
    (rollouts in training order), put version ``step`` into the parameter store and submit
    ``TrainStepCompleted(step, …)`` and ``WeightsPublished(step, digest, step - 1, parent_digest)``.
    """

    step: int
    parent_version: int
    parent_digest: str
    batch: BatchFormed
    rollouts: tuple[TrainRollout, ...]


@dataclasses.dataclass(frozen=True)
class InitTask:
    """Publish version 0 (the initial weights): submit ``WeightsPublished(0, digest, -1, "")``."""

    version: int = 0


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The answer to one submitted input: accepted into the ledger, or rejected and why."""

    accepted: bool
    reason: str | None = None


ACCEPTED = Verdict(True)
