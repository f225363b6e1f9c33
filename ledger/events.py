"""The event vocabulary of a run.

Every event is a frozen dataclass with a stable ``KIND`` string and a schema ``VERSION``. The
store keeps ``(kind, version, body)``; the body is the canonical msgpack encoding of the field
values in the order of their sorted names (``ledger.codec``). When a kind gains or changes a
field, its ``VERSION`` goes up and an upcaster ``(kind, old_version) -> new body`` is registered
with the old version's field names, so bodies written by older software are read as current
events (as in pyeventsourcing's upcasting).

Field values are limited to what the codec can encode canonically: ``None``, ``bool``, ``int``,
``float``, ``str``, ``bytes``, tuples, dicts with string keys, and numpy arrays (token ids,
log-probs) which round-trip bit-exactly with dtype and shape.

Ids are plain integers assigned by the controller in order (rollout ids, group ids, step
numbers), so that ordering by id is deterministic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, NamedTuple, dataclass_transform

import numpy as np

from ledger.canonical import pack

Body = dict[str, Any]
Upcaster = Callable[[Body], Body]


class Event:
    """Base of all events; subclasses are frozen dataclasses registered with ``@event``."""

    KIND: ClassVar[str]
    VERSION: ClassVar[int]

    FIELDS: ClassVar[tuple[str, ...]]
    # Declared for the type checker: ``@event`` makes every subclass a dataclass.
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def fields(self) -> Body:
        """The event's fields as a dict, in declaration order (not a deep copy)."""
        return {name: getattr(self, name) for name in self.FIELDS}

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self.first_difference(other) is None

    def first_difference(self, other: Event) -> str | None:
        """The name of the first field (in declaration order) whose values differ, or None.

        Values are compared as the codec stores them: arrays by dtype, shape and bytes, tuples
        and lists alike, NaN equal to NaN. ``"KIND"`` when the events are of different kinds.
        """
        if type(other) is not type(self):
            return "KIND"
        for name in self.FIELDS:
            a, b = getattr(self, name), getattr(other, name)
            if a is b:
                continue
            ta = type(a)
            if ta is type(b) and (ta is int or ta is str or ta is bool):
                if a != b:
                    return name
            elif not _values_equal(a, b):
                return name
        return None

    def __hash__(self) -> int:
        # Events equal by ``first_difference`` have the same canonical bytes: their body's.
        return hash((self.KIND, pack(self.fields())))


def _values_equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.tobytes() == b.tobytes()
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_values_equal(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_values_equal(x, y) for x, y in zip(a, b, strict=False))
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True  # NaN fields compare equal to themselves: events are values
    return type(a) is type(b) and a == b


class Registry:
    """Event classes by kind, and upcasters from older versions of each kind."""

    def __init__(self) -> None:
        self._classes: dict[str, type[Event]] = {}
        self._upcasters: dict[tuple[str, int], Upcaster] = {}
        self._field_names: dict[str, tuple[str, ...]] = {}
        self._required: dict[str, frozenset[str]] = {}
        self._layouts: dict[tuple[str, int], tuple[str, ...]] = {}
        # kind -> (class, current version, field names sorted): the decoder's fast path.
        self.current: dict[str, tuple[type[Event], int, tuple[str, ...]]] = {}

    def register(self, cls: type[Event]) -> type[Event]:
        if cls.KIND in self._classes and self._classes[cls.KIND] is not cls:
            raise ValueError(f"event kind {cls.KIND!r} registered twice")
        fields = dataclasses.fields(cls)
        self._classes[cls.KIND] = cls
        self._field_names[cls.KIND] = tuple(f.name for f in fields)
        self.current[cls.KIND] = (cls, cls.VERSION, tuple(sorted(f.name for f in fields)))
        self._layouts[(cls.KIND, cls.VERSION)] = self.current[cls.KIND][2]
        self._required[cls.KIND] = frozenset(
            f.name
            for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )
        return cls

    def register_upcaster(self, kind: str, from_version: int, fn: Upcaster,
                          fields: tuple[str, ...] | None = None) -> None:
        key = (kind, from_version)
        if key in self._upcasters:
            raise ValueError(f"upcaster for {kind!r} v{from_version} registered twice")
        self._upcasters[key] = fn
        if fields is not None:
            self._layouts[key] = tuple(sorted(fields))

    def layout(self, kind: str, version: int) -> tuple[str, ...] | None:
        """The sorted field names of ``kind`` at schema ``version``: the order of the values of a
        body stored as an array (``ledger.codec``); None when that version's fields are unknown."""
        return self._layouts.get((kind, version))

    def cls(self, kind: str) -> type[Event] | None:
        return self._classes.get(kind)

    def kinds(self) -> list[str]:
        return sorted(self._classes)

    def field_names(self, kind: str) -> tuple[str, ...]:
        return self._field_names[kind]

    def required(self, kind: str) -> frozenset[str]:
        return self._required[kind]

    def upcaster(self, kind: str, from_version: int) -> Upcaster | None:
        return self._upcasters.get((kind, from_version))

    def __iter__(self) -> Iterator[type[Event]]:
        return iter(self._classes[k] for k in self.kinds())


EVENTS = Registry()


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def event(kind: str, version: int = 1, registry: Registry = EVENTS) -> Callable[[type[Event]], type[Event]]:
    """Class decorator: make a frozen event dataclass of ``kind`` at schema ``version``."""

    def wrap(cls: type[Event]) -> type[Event]:
        cls.KIND = kind
        cls.VERSION = version
        dc = dataclasses.dataclass(frozen=True, eq=False)(cls)
        dc.FIELDS = tuple(f.name for f in dataclasses.fields(dc))
        registry.register(dc)
        return dc

    return wrap


def upcaster(kind: str, from_version: int, registry: Registry = EVENTS, *,
             fields: tuple[str, ...] | None = None) -> Callable[[Upcaster], Upcaster]:
    """Decorator: register ``fn(body_v) -> body_v+1`` for bodies of ``kind`` at ``from_version``.

    ``fields``: the field names of ``kind`` at ``from_version``. Bodies are stored as arrays of
    field values, so when a kind's ``VERSION`` goes up, the upcaster from the version before
    must name that version's fields for its stored bodies to be read (bodies of versions whose
    ledgers predate array bodies are maps and need none).
    """

    def wrap(fn: Upcaster) -> Upcaster:
        registry.register_upcaster(kind, from_version, fn, fields)
        return fn

    return wrap


# --------------------------------------------------------------------------------------------
# Run lifecycle


@event("RunStarted")
class RunStarted(Event):
    """A run begins: its resolved config (and digest), seed and environment fingerprint."""

    run_id: str
    config: dict
    config_digest: str
    seed: int
    fingerprint: dict = dataclasses.field(default_factory=dict)


@event("RunForked")
class RunForked(Event):
    """This run continues another run's history from a point of it: every event before this one
    is the parent's, seq for seq and byte for byte, so the hash chain up to here is the parent's
    (``parent_digest`` is the parent's chain digest at ``parent_seq``, this event's own ``seq - 1``).

    ``parent`` is the parent's run directory (absolute) and ``parent_run`` its run id; ``version``
    the newest version published at the fork point. ``changes`` maps each setting the fork changed
    (``section.field``) to ``[parent value, fork value]``; ``config`` is the whole resolved config
    from here on (its digest ``config_digest``) and ``inputs`` the input files it reads, as
    ``RunStarted``'s fingerprint records them (``runtime.inputs``). ``reason`` says why the fork was
    made: ``"fork"`` (``rlx fork``) or ``"rescore"`` (``rlx replay --rescore``).
    """

    parent: str
    parent_run: str
    parent_seq: int
    parent_digest: str
    version: int
    changes: dict
    config: dict
    config_digest: str
    inputs: dict = dataclasses.field(default_factory=dict)
    reason: str = "fork"


@event("ControllerStarted")
class ControllerStarted(Event):
    """A controller took the writer epoch ``epoch`` (first start or resume).

    ``snapshot_seq`` and ``snapshot_digest``: the snapshot a resume folded on from (its seq and
    the sha256 of its body in hex), so the chain records what the resumed state came from and
    ``rlx ledger verify`` can prove it after the row is gone; 0 and ``""`` when the fold started
    at seq 1 (a new run, or a resume without a usable snapshot).
    """

    epoch: int
    head_seq: int
    fingerprint: dict = dataclasses.field(default_factory=dict)
    snapshot_seq: int = 0
    snapshot_digest: str = ""


@event("SnapshotTaken")
class SnapshotTaken(Event):
    """The controller stored a snapshot of its fold at this event's own seq: ``digest`` is the
    sha256 (hex) of the snapshot's body, of format ``format``. A snapshot is trusted only where
    the log commits to it this way, so the hash chain covers what a resume starts from
    (``runtime.controller.snapshot``). It changes no state."""

    digest: str
    format: int


@event("RunFinished")
class RunFinished(Event):
    """The run ended: the last version and its digest."""

    final_version: int
    final_digest: str
    reason: str = "completed"


# --------------------------------------------------------------------------------------------
# Sampling and rollouts


@event("PromptsSampled")
class PromptsSampled(Event):
    """Prompts drawn for new groups of one batch, in the order their groups are requested.

    ``ordinal`` is the position of the first group among the groups requested for ``batch``
    (0 for a batch's first draw; resampled groups continue the count). ``position`` is where the
    first prompt sits in the run's prompt stream (one seeded shuffle of the dataset per
    ``data_epoch``, concatenated), or -1 for a resample drawn from its own keyed stream.
    """

    batch: int
    data_epoch: int
    prompt_indices: tuple
    ordinal: int = 0
    position: int = -1


class SampleRequest(NamedTuple):
    """One requested rollout: the fields of its ``RolloutRequested`` with its own id and seed."""

    rollout_id: int
    group_id: int
    batch: int
    prompt_index: int
    policy_version: int
    seed: int
    sampling: dict
    ordinal: int


@event("RolloutRequested", version=2)
class RolloutRequested(Event):
    """Samples of group ``group_id`` requested from ``policy_version``, each with its own seed.

    ``rollout_ids`` are consecutive and ``seeds[i]`` is the sampling seed of ``rollout_ids[i]``.
    ``batch`` is the batch the group is requested for and ``ordinal`` the group's position
    among that batch's groups; a seed is a pure function of (run seed, batch, ordinal, sample),
    so a request's content never depends on when it was made. The controller requests a
    group's samples in one event (schema version 1 requested one sample per event, so a group
    may span several events of an older ledger).
    """

    rollout_ids: tuple
    group_id: int
    batch: int
    prompt_index: int
    policy_version: int
    seeds: tuple
    sampling: dict
    ordinal: int = 0

    def samples(self) -> tuple[SampleRequest, ...]:
        """One :class:`SampleRequest` per requested rollout, in id order."""
        return tuple(
            SampleRequest(rid, self.group_id, self.batch, self.prompt_index, self.policy_version, seed,
                          self.sampling, self.ordinal)
            for rid, seed in zip(self.rollout_ids, self.seeds, strict=False)
        )


@upcaster("RolloutRequested", 1)
def upcast_requested_v1_v2(body: Body) -> Body:
    """Version 1 (``rollout_id``, ``seed``): one sample per event."""
    body["rollout_ids"] = (body.pop("rollout_id"),)
    body["seeds"] = (body.pop("seed"),)
    return body


@event("RolloutAssigned", version=2)
class RolloutAssigned(Event):
    """Requests leased to one worker, in rollout-id order.

    ``attempts[i]`` counts the earlier leases of ``rollout_ids[i]`` (0 for its first lease).
    One event carries every request a decision leases to the worker (schema version 1 leased
    one request per event).
    """

    worker_id: str
    rollout_ids: tuple
    attempts: tuple


@upcaster("RolloutAssigned", 1)
def upcast_assigned_v1_v2(body: Body) -> Body:
    """Version 1 (``rollout_id``, ``worker_id``, ``attempt``): one request per event."""
    return {"worker_id": body["worker_id"], "rollout_ids": (body["rollout_id"],), "attempts": (body["attempt"],)}


@event("RolloutCompleted", version=2)
class RolloutCompleted(Event):
    """The accepted result of a request: sampled token ids and their log-probs.

    ``turns``: empty for one completion; for a multi-turn episode (``runtime.episodes.rollout``)
    one record per turn — ``sampled`` and ``appended`` (how many of ``tokens`` the model sampled,
    then the environment appended) and ``call`` (the turn's tool call: tool, arguments, result
    bytes, exit status, wall time, truncation and status; None for the final answer). ``tokens``
    is then every id of the episode after its prompt, and ``logprobs`` is 0 on appended ids.
    (Schema version 1 had no ``turns``.)
    """

    rollout_id: int
    worker_id: str
    attempt: int
    policy_version: int
    weights_digest: str
    tokens: np.ndarray
    logprobs: np.ndarray
    finish_reason: str
    turns: tuple = ()


@upcaster("RolloutCompleted", 1, fields=("rollout_id", "worker_id", "attempt", "policy_version", "weights_digest",
                                         "tokens", "logprobs", "finish_reason"))
def upcast_completed_v1_v2(body: Body) -> Body:
    """Version 1: one completion per rollout, no turns."""
    body["turns"] = ()
    return body


@event("RolloutAbandoned")
class RolloutAbandoned(Event):
    """A lease is given up (its expiry was observed); the request goes back to the queue."""

    rollout_id: int
    attempt: int
    reason: str


@event("GroupDiscarded")
class GroupDiscarded(Event):
    """A group leaves the run without entering a batch; its late completions are rejected.

    Reasons: ``uniform_reward`` (every sample got the same reward: no learning signal, DAPO
    dynamic sampling), ``stale`` (freshest mode: its policy version fell behind the staleness
    bound of the next batch).
    """

    group_id: int
    reason: str


@event("OutcomeRecorded")
class OutcomeRecorded(Event):
    """The verifier's typed outcome for a completed rollout."""

    rollout_id: int
    reward: float
    passed: bool
    verdict: str
    verifier: str
    verifier_version: str
    detail: str = ""

    DETAIL_CHARS: ClassVar[int] = 200

    @classmethod
    def of(cls, rollout_id: int, outcome: Any, reward: float) -> OutcomeRecorded:
        """The record of a verifier's ``Outcome`` (``verifiers.outcome``) for ``rollout_id``,
        with the reward the task gives it; its detail is cut to ``DETAIL_CHARS``."""
        verdict = outcome.verdict
        return cls(rollout_id, float(reward), bool(outcome.passed), str(getattr(verdict, "value", verdict)),
                   outcome.verifier, outcome.version, outcome.detail[: cls.DETAIL_CHARS])


# --------------------------------------------------------------------------------------------
# Training and weights


@event("BatchFormed")
class BatchFormed(Event):
    """The rollouts (whole groups, in training order) that step ``step`` consumes."""

    step: int
    group_ids: tuple
    rollout_ids: tuple
    policy_versions: tuple


@event("TrainStepCompleted")
class TrainStepCompleted(Event):
    """Step ``step`` turned version ``step - 1`` into version ``step``; metrics of the step."""

    step: int
    batch_digest: str
    metrics: dict


@event("WeightsPublished")
class WeightsPublished(Event):
    """Version ``version`` is complete in the parameter store with ``digest``."""

    version: int
    digest: str
    parent_version: int
    parent_digest: str


@event("VersionEvaluated")
class VersionEvaluated(Event):
    """Held-out evaluation of weight version ``version`` (weights ``digest``).

    On ``problems`` held-out problems: ``greedy_pass_rate`` of one greedy completion each;
    ``samples`` completions each at the run's sampling temperature (seeded by run seed, version,
    problem and sample), whose mean pass rate is ``sampled_pass_rate`` and whose unbiased
    ``pass@k`` estimate (Chen et al. 2021: ``1 - C(n-c, k) / C(n, k)`` per problem, averaged) is
    ``pass_at_k``. No decision reads it; the fold admits one per version that ``eval.every_steps``
    makes due, naming that version's published digest.
    """

    version: int
    digest: str
    problems: int
    greedy_pass_rate: float
    k: int
    samples: int
    pass_at_k: float
    sampled_pass_rate: float
    evaluator: str = ""


@event("VersionsRetired")
class VersionsRetired(Event):
    """The run no longer needs these parameter versions; the parameter store may evict them.

    Never the newest version, a version an outstanding request was made from, or one a future
    request or a resume needs (I5).
    """

    versions: tuple


# --------------------------------------------------------------------------------------------
# Workers


@event("WorkerJoined")
class WorkerJoined(Event):
    """A worker of ``role`` (inference, verifier, trainer) became available with ``slots`` leases."""

    worker_id: str
    role: str
    info: dict = dataclasses.field(default_factory=dict)
    slots: int = 1


@event("WorkerLost")
class WorkerLost(Event):
    """A worker is gone (stopped heartbeating, crashed, shut down); its leases go back to the queue."""

    worker_id: str
    reason: str
