"""Work items and events on the wire, and the checks every submitted event passes.

Events travel in the ledger's own encoding (kind, schema version, canonical msgpack body). What a
worker submits is hostile until checked: here it must decode, within the message ceilings; what
it decodes to is checked by the front (``runtime.host.admission``) like a thread's submission.
"""

from __future__ import annotations

from ledger import events as ev
from ledger.codec import decode_body, encode_event, pack, unpack
from ledger.errors import CodecError
from runtime._generated import rlx_controller_pb2 as pb
from runtime.controller.workers import InitTask, Lease, ScoreTask, TrainRollout, TrainTask
from runtime.host import admission
from runtime.host.front import MAX_INFO_BYTES as MAX_INFO_BYTES  # the front checks it too (threads)
from runtime.host.port import Refused

MAX_MESSAGE_BYTES = 256 << 20  # a train task of 1,024 rollouts x 16k tokens is about 128 MiB
# The ceilings of what a call may carry are the front's (``runtime.host.admission``).
MAX_POLL_ITEMS, MAX_SLOTS, MAX_TEXT, MAX_WAIT_S = (admission.MAX_POLL_ITEMS, admission.MAX_SLOTS, admission.MAX_TEXT,
                                                   admission.MAX_WAIT_S)
SUBMITS = admission.SUBMITS


class WireError(Refused):
    """A message that cannot be decoded into what it claims to be."""


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


def train_to_proto(task: TrainTask | InitTask | None) -> pb.TrainTask:
    if task is None or isinstance(task, InitTask):  # version 0
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


def train_from_proto(m: pb.TrainTask) -> TrainTask | InitTask:
    """The step to train, or ``InitTask`` for "publish version 0"."""
    if m.step == 0:
        return InitTask()
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


def events_from_proto(messages) -> list[ev.Event]:
    """The events of a ``Submit``, decoded (their kinds and bounds are the front's to check)."""
    if len(messages) > admission.MAX_SUBMIT_EVENTS:
        raise WireError(f"{len(messages)} events in one submission; at most {admission.MAX_SUBMIT_EVENTS} are accepted")
    return [event_from_proto(m) for m in messages]
