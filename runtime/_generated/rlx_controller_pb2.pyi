from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Standing(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STANDING_UNSPECIFIED: _ClassVar[Standing]
    JOINED: _ClassVar[Standing]
    NOT_JOINED: _ClassVar[Standing]
    FINISHED: _ClassVar[Standing]
STANDING_UNSPECIFIED: Standing
JOINED: Standing
NOT_JOINED: Standing
FINISHED: Standing

class Event(_message.Message):
    __slots__ = ("kind", "version", "body")
    KIND_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    kind: str
    version: int
    body: bytes
    def __init__(self, kind: _Optional[str] = ..., version: _Optional[int] = ..., body: _Optional[bytes] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("worker_id", "role", "slots", "info")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    role: str
    slots: int
    info: bytes
    def __init__(self, worker_id: _Optional[str] = ..., role: _Optional[str] = ..., slots: _Optional[int] = ..., info: _Optional[bytes] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RunInfo(_message.Message):
    __slots__ = ("standing", "run_id", "config", "params_url", "epoch", "heartbeat_s")
    STANDING_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    PARAMS_URL_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_S_FIELD_NUMBER: _ClassVar[int]
    standing: Standing
    run_id: str
    config: bytes
    params_url: str
    epoch: int
    heartbeat_s: float
    def __init__(self, standing: _Optional[_Union[Standing, str]] = ..., run_id: _Optional[str] = ..., config: _Optional[bytes] = ..., params_url: _Optional[str] = ..., epoch: _Optional[int] = ..., heartbeat_s: _Optional[float] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("standing", "worker_id", "epoch", "secret")
    STANDING_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    standing: Standing
    worker_id: str
    epoch: int
    secret: str
    def __init__(self, standing: _Optional[_Union[Standing, str]] = ..., worker_id: _Optional[str] = ..., epoch: _Optional[int] = ..., secret: _Optional[str] = ...) -> None: ...

class PollRequest(_message.Message):
    __slots__ = ("worker_id", "secret", "max", "wait_s")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    secret: str
    max: int
    wait_s: float
    def __init__(self, worker_id: _Optional[str] = ..., secret: _Optional[str] = ..., max: _Optional[int] = ..., wait_s: _Optional[float] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("rollout_id", "attempt", "group_id", "batch", "ordinal", "prompt_index", "policy_version", "weights_digest", "seed", "sampling")
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    ORDINAL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    rollout_id: int
    attempt: int
    group_id: int
    batch: int
    ordinal: int
    prompt_index: int
    policy_version: int
    weights_digest: str
    seed: int
    sampling: bytes
    def __init__(self, rollout_id: _Optional[int] = ..., attempt: _Optional[int] = ..., group_id: _Optional[int] = ..., batch: _Optional[int] = ..., ordinal: _Optional[int] = ..., prompt_index: _Optional[int] = ..., policy_version: _Optional[int] = ..., weights_digest: _Optional[str] = ..., seed: _Optional[int] = ..., sampling: _Optional[bytes] = ...) -> None: ...

class ScoreTask(_message.Message):
    __slots__ = ("rollout_id", "prompt_index", "completion")
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    rollout_id: int
    prompt_index: int
    completion: Event
    def __init__(self, rollout_id: _Optional[int] = ..., prompt_index: _Optional[int] = ..., completion: _Optional[_Union[Event, _Mapping]] = ...) -> None: ...

class SampleRequest(_message.Message):
    __slots__ = ("rollout_id", "group_id", "batch", "prompt_index", "policy_version", "seed", "sampling", "ordinal")
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    PROMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    ORDINAL_FIELD_NUMBER: _ClassVar[int]
    rollout_id: int
    group_id: int
    batch: int
    prompt_index: int
    policy_version: int
    seed: int
    sampling: bytes
    ordinal: int
    def __init__(self, rollout_id: _Optional[int] = ..., group_id: _Optional[int] = ..., batch: _Optional[int] = ..., prompt_index: _Optional[int] = ..., policy_version: _Optional[int] = ..., seed: _Optional[int] = ..., sampling: _Optional[bytes] = ..., ordinal: _Optional[int] = ...) -> None: ...

class TrainRollout(_message.Message):
    __slots__ = ("request", "completion", "outcome")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    request: SampleRequest
    completion: Event
    outcome: Event
    def __init__(self, request: _Optional[_Union[SampleRequest, _Mapping]] = ..., completion: _Optional[_Union[Event, _Mapping]] = ..., outcome: _Optional[_Union[Event, _Mapping]] = ...) -> None: ...

class TrainTask(_message.Message):
    __slots__ = ("step", "parent_version", "parent_digest", "batch", "rollouts")
    STEP_FIELD_NUMBER: _ClassVar[int]
    PARENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    PARENT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    step: int
    parent_version: int
    parent_digest: str
    batch: Event
    rollouts: _containers.RepeatedCompositeFieldContainer[TrainRollout]
    def __init__(self, step: _Optional[int] = ..., parent_version: _Optional[int] = ..., parent_digest: _Optional[str] = ..., batch: _Optional[_Union[Event, _Mapping]] = ..., rollouts: _Optional[_Iterable[_Union[TrainRollout, _Mapping]]] = ...) -> None: ...

class PollReply(_message.Message):
    __slots__ = ("standing", "leases", "scores", "train")
    STANDING_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    TRAIN_FIELD_NUMBER: _ClassVar[int]
    standing: Standing
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    scores: _containers.RepeatedCompositeFieldContainer[ScoreTask]
    train: TrainTask
    def __init__(self, standing: _Optional[_Union[Standing, str]] = ..., leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ..., scores: _Optional[_Iterable[_Union[ScoreTask, _Mapping]]] = ..., train: _Optional[_Union[TrainTask, _Mapping]] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("worker_id", "secret", "events")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    secret: str
    events: _containers.RepeatedCompositeFieldContainer[Event]
    def __init__(self, worker_id: _Optional[str] = ..., secret: _Optional[str] = ..., events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ...) -> None: ...

class Verdict(_message.Message):
    __slots__ = ("accepted", "reason")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class SubmitReply(_message.Message):
    __slots__ = ("standing", "verdicts")
    STANDING_FIELD_NUMBER: _ClassVar[int]
    VERDICTS_FIELD_NUMBER: _ClassVar[int]
    standing: Standing
    verdicts: _containers.RepeatedCompositeFieldContainer[Verdict]
    def __init__(self, standing: _Optional[_Union[Standing, str]] = ..., verdicts: _Optional[_Iterable[_Union[Verdict, _Mapping]]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "secret", "rollouts", "steps")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    secret: str
    rollouts: _containers.RepeatedScalarFieldContainer[int]
    steps: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, worker_id: _Optional[str] = ..., secret: _Optional[str] = ..., rollouts: _Optional[_Iterable[int]] = ..., steps: _Optional[_Iterable[int]] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("standing",)
    STANDING_FIELD_NUMBER: _ClassVar[int]
    standing: Standing
    def __init__(self, standing: _Optional[_Union[Standing, str]] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("worker_id", "secret", "reason")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    secret: str
    reason: str
    def __init__(self, worker_id: _Optional[str] = ..., secret: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class LeaveReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
