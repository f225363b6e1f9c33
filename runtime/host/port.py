"""The controller port: what a worker may ask of the run it serves, in Python types.

Every worker — a thread of ``rlx run`` or a process on another machine — talks to its run through
this one interface and nothing else: ``describe`` the run, ``join`` with a role, long-``poll``
for work, ``submit`` results, ``heartbeat`` while working, ``leave``. A worker id is not a
credential: ``join`` answers a secret of that worker's own (``Joined.secret``, kept in the front's
memory, never in the ledger) and every later call under that id carries it; a port remembers the
secrets of the ids it joined, so the worker loop calls by id. ``runtime.host.threads.ThreadPort``
implements the port over the run's :class:`runtime.host.front.Front` in the same process;
``runtime.service.client.ControllerClient`` implements it over gRPC (``runtime.service.server``
only converts the messages to and from a ``Front``). So both runners run the same worker loop
(``runtime.host.worker``) against the same admission rules.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from ledger import events as ev
from runtime.controller.workers import InitTask, Lease, ScoreTask, TrainTask, Verdict
from runtime.errors import RlxError


class Standing(enum.IntEnum):
    """Where a worker stands with the run (the values are the wire's ``Standing``)."""

    JOINED = 1  # carry on
    NOT_JOINED = 2  # unknown or declared lost: join again under a new worker id
    FINISHED = 3  # the run has finished: exit


class Refused(RlxError):
    """A call that cannot be what it claims: a malformed id, a kind its role may not submit, a
    value out of bounds, a claim the parameter store does not back. Retrying cannot help."""


class WrongSecret(Refused):
    """A call under a worker id without the secret its ``join`` answered: another client's worker."""


class AlreadyJoined(RlxError):
    """The worker id is taken; join under another."""


class Disconnected(RlxError):
    """No controller answered; try again later (perhaps another address)."""


class Busy(Disconnected):
    """The controller is at one of its ceilings (joins a second, polls at once, one trainer);
    try again later, like a controller that did not answer."""


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What ``describe`` tells a worker: the run, its logged config and its parameter store."""

    standing: Standing
    run_id: str
    config: dict[str, Any]
    params_url: str
    epoch: int
    heartbeat_s: float


@dataclasses.dataclass(frozen=True)
class Joined:
    """A join's answer; ``secret``: what every later call under ``worker_id`` carries."""

    standing: Standing
    worker_id: str
    epoch: int
    secret: str = dataclasses.field(default="", repr=False)


@dataclasses.dataclass(frozen=True)
class Work:
    """A poll's answer: the leases (inference), completions to score (verifier) or the step to
    train (trainer; ``InitTask`` publishes version 0) the worker's role has to do, if any."""

    standing: Standing
    leases: tuple[Lease, ...] = ()
    scores: tuple[ScoreTask, ...] = ()
    train: TrainTask | InitTask | None = None

    def __bool__(self) -> bool:
        return bool(self.leases or self.scores or self.train is not None)


@dataclasses.dataclass(frozen=True)
class Submitted:
    standing: Standing
    verdicts: tuple[Verdict, ...]


class ControllerPort(Protocol):
    """A run as its workers see it (see the module docstring). The calls after ``join`` carry
    the secret the port's ``join`` of that worker id answered."""

    def describe(self) -> RunInfo: ...

    def join(self, worker_id: str, role: str, *, slots: int = 1, info: dict | None = None) -> Joined: ...

    def poll(self, worker_id: str, *, max_items: int = 512, wait_s: float = 5.0) -> Work: ...

    def submit(self, worker_id: str, events: Sequence[ev.Event]) -> Submitted: ...

    def heartbeat(self, worker_id: str, *, rollouts: Iterable[int] = (), steps: Iterable[int] = ()) -> Standing: ...

    def leave(self, worker_id: str, reason: str) -> None: ...


__all__ = ["AlreadyJoined", "Busy", "ControllerPort", "Disconnected", "Joined", "Refused", "RunInfo", "Standing",
           "Submitted", "Work", "WrongSecret"]
