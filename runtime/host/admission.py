"""What a worker may submit, checked before the controller's admission sees it.

Whatever arrives from a worker is hostile until checked, whether it came over gRPC or from a
thread of this process: each event must be of a kind the worker's role may submit (one kind →
role table, :data:`SUBMITS`), carry fields of the declared types within their ceilings and values
the run could have produced (``runtime.controller.admit.completion_values`` and
``outcome_values``: token ids in the model's vocabulary, at most ``sampling.max_tokens`` of them
with a consistent finish reason, finite log-probs <= 0, rewards in the tasks' range), and (for a
completion) name the worker that submits it. A trainer submits a step's ``TrainStepCompleted``
and its ``WeightsPublished`` together, or version 0 alone. The controller's own admission
(``runtime.controller.admit``) then decides against the fold.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

from ledger import events as ev
from runtime.config import Config
from runtime.controller.admit import UNBOUNDED, Bounds, completion_values, outcome_values, publication
from runtime.controller.workers import INFERENCE, ROLES, TRAINER, VERIFIER
from runtime.host.port import Refused

MAX_SUBMIT_EVENTS = 65_536
MAX_POLL_ITEMS = 65_536
MAX_WAIT_S = 30.0
MAX_TOKENS = 1 << 20  # tokens of one completion
MAX_TEXT = 256  # characters of an id, digest, verdict or reason
MAX_METRICS = 1024
MAX_SLOTS = 65_536
SUBMITS: dict[str, frozenset[type]] = {
    INFERENCE: frozenset({ev.RolloutCompleted}),
    VERIFIER: frozenset({ev.OutcomeRecorded}),
    TRAINER: frozenset({ev.TrainStepCompleted, ev.WeightsPublished}),
}
"""The event kinds each role may submit."""
FINISH_REASONS = frozenset({"stop", "length"})
_WORKER_ID = re.compile(r"[A-Za-z0-9_.:@~+-]{1,128}")


def worker_id(value: str) -> str:
    """``value`` if it is a valid worker id."""
    if type(value) is not str or not _WORKER_ID.fullmatch(value):
        raise Refused(f"worker id {str(value)[:40]!r} must be 1 to 128 characters of A-Z a-z 0-9 _ . : @ ~ + -")
    return value


def joining(role: str, slots: int) -> None:
    """Refuse a join under an unknown role or with a slot count out of bounds."""
    if role not in ROLES:
        raise Refused(f"role {str(role)[:40]!r} is not accepted; accepted: {', '.join(ROLES)}")
    if type(slots) is not int or not 1 <= slots <= MAX_SLOTS:
        raise Refused(f"slots {slots!r} must be from 1 to {MAX_SLOTS}")


def role_of(events: Sequence[ev.Event]) -> str:
    """The role whose submissions these are, for a worker that is no longer joined."""
    kinds = {type(e) for e in events}
    for role, allowed in SUBMITS.items():
        if kinds and kinds <= allowed:
            return role
    raise Refused("a submission mixes the results of several roles, or is empty")


def _int(value, name: str, low: int = 0) -> None:
    if type(value) is not int or not low <= value < 1 << 63:
        raise Refused(f"{name} must be an integer >= {low}, got {value!r}")


def _text(value, name: str, limit: int = MAX_TEXT) -> None:
    if type(value) is not str or len(value) > limit:
        raise Refused(f"{name} must be a string of at most {limit} characters")


def _check_completion(e: ev.RolloutCompleted, worker: str, bounds: Bounds) -> None:
    for name in ("rollout_id", "attempt", "policy_version"):
        _int(getattr(e, name), f"RolloutCompleted.{name}")
    _text(e.weights_digest, "RolloutCompleted.weights_digest")
    if e.worker_id != worker:
        raise Refused(f"worker {worker!r} submitted a completion in the name of {e.worker_id!r}")
    tokens, logprobs = e.tokens, e.logprobs
    if not (type(tokens) is np.ndarray and tokens.dtype == np.int32 and tokens.ndim == 1):
        raise Refused("RolloutCompleted.tokens must be a 1-D int32 array")
    if not (type(logprobs) is np.ndarray and logprobs.dtype == np.float32 and logprobs.shape == tokens.shape):
        raise Refused("RolloutCompleted.logprobs must be a float32 array as long as its tokens")
    if len(tokens) > MAX_TOKENS:
        raise Refused(f"a completion of {len(tokens)} tokens exceeds the ceiling of {MAX_TOKENS}")
    if e.finish_reason not in FINISH_REASONS:
        raise Refused(f"finish_reason {str(e.finish_reason)[:40]!r} is not one of {sorted(FINISH_REASONS)}")
    problem = completion_values(e, bounds)
    if problem is not None:
        raise Refused(f"RolloutCompleted of {problem}")


def _check_outcome(e: ev.OutcomeRecorded) -> None:
    _int(e.rollout_id, "OutcomeRecorded.rollout_id")
    if type(e.reward) is not float or not math.isfinite(e.reward):
        raise Refused(f"OutcomeRecorded.reward must be a finite float, got {e.reward!r}")
    if type(e.passed) is not bool:
        raise Refused("OutcomeRecorded.passed must be a boolean")
    for name in ("verdict", "verifier", "verifier_version"):
        _text(getattr(e, name), f"OutcomeRecorded.{name}")
    _text(e.detail, "OutcomeRecorded.detail", ev.OutcomeRecorded.DETAIL_CHARS)
    problem = outcome_values(e)
    if problem is not None:
        raise Refused(f"OutcomeRecorded of {problem}")


def _check_step(e: ev.TrainStepCompleted) -> None:
    _int(e.step, "TrainStepCompleted.step", 1)
    _text(e.batch_digest, "TrainStepCompleted.batch_digest")
    if type(e.metrics) is not dict or len(e.metrics) > MAX_METRICS:
        raise Refused(f"TrainStepCompleted.metrics must be a map of at most {MAX_METRICS} entries")
    for k, v in e.metrics.items():
        _text(k, "a metric name")
        if type(v) is not float:
            raise Refused(f"metric {k!r} must be a float, got {type(v).__name__}")


def _check_weights(e: ev.WeightsPublished) -> None:
    _int(e.version, "WeightsPublished.version")
    _int(e.parent_version, "WeightsPublished.parent_version", -1)
    _text(e.digest, "WeightsPublished.digest")
    _text(e.parent_digest, "WeightsPublished.parent_digest")


_CHECKS = {
    ev.OutcomeRecorded: _check_outcome,
    ev.TrainStepCompleted: _check_step,
    ev.WeightsPublished: _check_weights,
}


def bounds(config: Config) -> Bounds:
    """The bounds of a run's completions: its model's vocabulary size (the width of its logits,
    from the checkpoint's ``config.json`` or the built-in model's; no weights are read) and
    ``sampling.max_tokens``."""
    if config.model.path is None:
        from runtime.session import builtin_config

        vocab = builtin_config(config)[0].vocab_size
    else:
        import pathlib

        from runtime.model.hf import CONFIG_FILE, read_required_json
        from runtime.model.hf_convert import config_from_hf

        path = pathlib.Path(config.model.path) / CONFIG_FILE
        vocab = config_from_hf(read_required_json(path), source=str(path)).vocab_size
    return Bounds(int(vocab), config.max_tokens, bool(config.episodes.tools))


def submission(events: Sequence[ev.Event], role: str, worker: str, bounds: Bounds = UNBOUNDED) -> list[ev.Event]:
    """``events`` submitted by ``worker`` of ``role``, if each is of a kind that role may submit
    and within its bounds (``bounds``: the run's vocabulary and ``sampling.max_tokens``, where
    known), and a trainer's are one step's result."""
    if len(events) > MAX_SUBMIT_EVENTS:
        raise Refused(f"{len(events)} events in one submission; at most {MAX_SUBMIT_EVENTS} are accepted")
    allowed = SUBMITS[role]
    for e in events:
        kind = type(e)
        if kind not in allowed:
            raise Refused(f"a {role} worker may not submit {getattr(e, 'KIND', kind.__name__)} events "
                          f"(accepted: {', '.join(sorted(k.KIND for k in allowed))})")  # type: ignore[attr-defined]
        if kind is ev.RolloutCompleted:
            _check_completion(e, worker, bounds)  # type: ignore[arg-type]
        else:
            _CHECKS[kind](e)  # type: ignore[operator]
    if role == TRAINER:
        problem = publication(events)
        if problem is not None:
            raise Refused(problem)
    return list(events)


__all__ = ["MAX_POLL_ITEMS", "MAX_SLOTS", "MAX_SUBMIT_EVENTS", "MAX_TEXT", "MAX_WAIT_S", "SUBMITS", "bounds",
           "joining", "role_of", "submission", "worker_id"]
