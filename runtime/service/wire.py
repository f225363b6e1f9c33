"""Work items and events on the wire, and the checks every submitted event passes.

Events travel in the ledger's own encoding (kind, schema version, canonical msgpack body). What a
worker submits is hostile until checked: it must decode, be of a kind the worker's role may
submit, carry fields of the declared types within their ceilings, and (for a completion) name
the worker that submits it. Only then does the controller's admission see it.
"""

from __future__ import annotations

import math

import numpy as np

from ledger import events as ev
from ledger.codec import decode_body, encode_event, pack, unpack
from ledger.errors import CodecError
from runtime._generated import rlx_controller_pb2 as pb
from runtime.controller.workers import INFERENCE, TRAINER, VERIFIER, Lease, ScoreTask, TrainRollout, TrainTask
from runtime.errors import RlxError

MAX_MESSAGE_BYTES = 256 << 20  # a train task of 1,024 rollouts x 16k tokens is about 128 MiB
MAX_SUBMIT_EVENTS = 65_536
MAX_POLL_ITEMS = 65_536
MAX_WAIT_S = 30.0
MAX_TOKENS = 1 << 20  # tokens of one completion
MAX_TEXT = 256  # characters of an id, digest, verdict or reason
MAX_METRICS = 1024
MAX_SLOTS = 65_536
MAX_INFO_BYTES = 64 << 10
SUBMITS = {
    INFERENCE: frozenset({ev.RolloutCompleted}),
    VERIFIER: frozenset({ev.OutcomeRecorded}),
    TRAINER: frozenset({ev.TrainStepCompleted, ev.WeightsPublished}),
}
"""The event kinds each role may submit."""
FINISH_REASONS = frozenset({"stop", "length"})


class WireError(RlxError):
    """A message that cannot be what it claims: undecodable, of the wrong kind, or out of bounds."""


def event_to_proto(event: ev.Event) -> pb.Event:
    kind, version, body = encode_event(event)
    return pb.Event(kind=kind, version=version, body=body)


def event_from_proto(message: pb.Event) -> ev.Event:
    try:
        return decode_body(message.kind, message.version, message.body)
    except CodecError as e:
        raise WireError(str(e)) from None


def pack_map(value: dict) -> bytes:
    return pack(value)


def unpack_map(data: bytes, what: str, limit: int = MAX_MESSAGE_BYTES) -> dict:
    if len(data) > limit:
        raise WireError(f"{what} is {len(data)} bytes; at most {limit} are accepted")
    try:
        value = unpack(data) if data else {}
    except CodecError as e:
        raise WireError(f"{what}: {e}") from None
    if type(value) is not dict:
        raise WireError(f"{what} must be a map, not {type(value).__name__}")
    return value


# -- work items: controller -> worker ------------------------------------------------------------


def lease_to_proto(lease: Lease) -> pb.Lease:
    return pb.Lease(rollout_id=lease.rollout_id, attempt=lease.attempt, group_id=lease.group_id, batch=lease.batch,
                    ordinal=lease.ordinal, prompt_index=lease.prompt_index, policy_version=lease.policy_version,
                    weights_digest=lease.weights_digest, seed=lease.seed, sampling=pack_map(lease.sampling))


def lease_from_proto(m: pb.Lease) -> Lease:
    return Lease(m.rollout_id, m.attempt, m.group_id, m.batch, m.ordinal, m.prompt_index, m.policy_version,
                 m.weights_digest, m.seed, unpack_map(m.sampling, "lease sampling"))


def score_to_proto(task: ScoreTask) -> pb.ScoreTask:
    return pb.ScoreTask(rollout_id=task.rollout_id, prompt_index=task.prompt_index,
                        completion=event_to_proto(task.completion))


def score_from_proto(m: pb.ScoreTask) -> ScoreTask:
    completion = _expect(event_from_proto(m.completion), ev.RolloutCompleted)
    return ScoreTask(m.rollout_id, m.prompt_index, completion)


def _expect(event: ev.Event, kind: type):
    if type(event) is not kind:
        raise WireError(f"expected a {kind.KIND} event, got {event.KIND}")  # type: ignore[attr-defined]
    return event


def train_to_proto(task: TrainTask | None) -> pb.TrainTask:
    if task is None:  # version 0
        return pb.TrainTask(step=0)
    rollouts = [
        pb.TrainRollout(
            request=pb.SampleRequest(rollout_id=r.request.rollout_id, group_id=r.request.group_id,
                                     batch=r.request.batch, prompt_index=r.request.prompt_index,
                                     policy_version=r.request.policy_version, seed=r.request.seed,
                                     sampling=pack_map(r.request.sampling), ordinal=r.request.ordinal),
            completion=event_to_proto(r.completion), outcome=event_to_proto(r.outcome))
        for r in task.rollouts
    ]
    return pb.TrainTask(step=task.step, parent_version=task.parent_version, parent_digest=task.parent_digest,
                        batch=event_to_proto(task.batch), rollouts=rollouts)


def train_from_proto(m: pb.TrainTask) -> TrainTask | None:
    """The step to train, or None for "publish version 0"."""
    if m.step == 0:
        return None
    rollouts = []
    for r in m.rollouts:
        q = r.request
        request = ev.SampleRequest(q.rollout_id, q.group_id, q.batch, q.prompt_index, q.policy_version, q.seed,
                                   unpack_map(q.sampling, "request sampling"), q.ordinal)
        rollouts.append(TrainRollout(request, _expect(event_from_proto(r.completion), ev.RolloutCompleted),
                                     _expect(event_from_proto(r.outcome), ev.OutcomeRecorded)))
    batch = _expect(event_from_proto(m.batch), ev.BatchFormed)
    return TrainTask(m.step, m.parent_version, m.parent_digest, batch, tuple(rollouts))


# -- submissions: worker -> controller -------------------------------------------------------------


def _int(value, name: str, low: int = 0) -> None:
    if type(value) is not int or not low <= value < 1 << 63:
        raise WireError(f"{name} must be an integer >= {low}, got {value!r}")


def _text(value, name: str, limit: int = MAX_TEXT) -> None:
    if type(value) is not str or len(value) > limit:
        raise WireError(f"{name} must be a string of at most {limit} characters")


def _check_completion(e: ev.RolloutCompleted, worker_id: str) -> None:
    for name in ("rollout_id", "attempt", "policy_version"):
        _int(getattr(e, name), f"RolloutCompleted.{name}")
    _text(e.weights_digest, "RolloutCompleted.weights_digest")
    if e.worker_id != worker_id:
        raise WireError(f"worker {worker_id!r} submitted a completion in the name of {e.worker_id!r}")
    tokens, logprobs = e.tokens, e.logprobs
    if not (type(tokens) is np.ndarray and tokens.dtype == np.int32 and tokens.ndim == 1):
        raise WireError("RolloutCompleted.tokens must be a 1-D int32 array")
    if not (type(logprobs) is np.ndarray and logprobs.dtype == np.float32 and logprobs.shape == tokens.shape):
        raise WireError("RolloutCompleted.logprobs must be a float32 array as long as its tokens")
    if len(tokens) > MAX_TOKENS:
        raise WireError(f"a completion of {len(tokens)} tokens exceeds the ceiling of {MAX_TOKENS}")
    if e.finish_reason not in FINISH_REASONS:
        raise WireError(f"finish_reason {str(e.finish_reason)[:40]!r} is not one of {sorted(FINISH_REASONS)}")


def _check_outcome(e: ev.OutcomeRecorded) -> None:
    _int(e.rollout_id, "OutcomeRecorded.rollout_id")
    if type(e.reward) is not float or not math.isfinite(e.reward):
        raise WireError(f"OutcomeRecorded.reward must be a finite float, got {e.reward!r}")
    if type(e.passed) is not bool:
        raise WireError("OutcomeRecorded.passed must be a boolean")
    for name in ("verdict", "verifier", "verifier_version"):
        _text(getattr(e, name), f"OutcomeRecorded.{name}")
    _text(e.detail, "OutcomeRecorded.detail", ev.OutcomeRecorded.DETAIL_CHARS)


def _check_step(e: ev.TrainStepCompleted) -> None:
    _int(e.step, "TrainStepCompleted.step", 1)
    _text(e.batch_digest, "TrainStepCompleted.batch_digest")
    if type(e.metrics) is not dict or len(e.metrics) > MAX_METRICS:
        raise WireError(f"TrainStepCompleted.metrics must be a map of at most {MAX_METRICS} entries")
    for k, v in e.metrics.items():
        _text(k, "a metric name")
        if type(v) is not float:
            raise WireError(f"metric {k!r} must be a float, got {type(v).__name__}")


def _check_weights(e: ev.WeightsPublished) -> None:
    _int(e.version, "WeightsPublished.version")
    _int(e.parent_version, "WeightsPublished.parent_version", -1)
    _text(e.digest, "WeightsPublished.digest")
    _text(e.parent_digest, "WeightsPublished.parent_digest")


def submitted(messages, role: str, worker_id: str) -> list[ev.Event]:
    """The events of a ``Submit`` from ``worker_id`` of ``role``, decoded and checked."""
    if len(messages) > MAX_SUBMIT_EVENTS:
        raise WireError(f"{len(messages)} events in one submission; at most {MAX_SUBMIT_EVENTS} are accepted")
    allowed = SUBMITS[role]
    out = []
    for m in messages:
        e = event_from_proto(m)
        kind = type(e)
        if kind not in allowed:
            raise WireError(f"a {role} worker may not submit {e.KIND} events "
                            f"(accepted: {', '.join(sorted(k.KIND for k in allowed))})")  # type: ignore[attr-defined]
        if kind is ev.RolloutCompleted:
            _check_completion(e, worker_id)  # type: ignore[arg-type]
        elif kind is ev.OutcomeRecorded:
            _check_outcome(e)  # type: ignore[arg-type]
        elif kind is ev.TrainStepCompleted:
            _check_step(e)  # type: ignore[arg-type]
        else:
            _check_weights(e)  # type: ignore[arg-type]
        out.append(e)
    return out
