"""The controller's state: an immutable value folded from the ledger.

Records are ``NamedTuple``s and collections are persistent hash maps (``immutables.Map``, a
HAMT as in PEP 567) or sorted tuples, so every update returns a new value that shares almost
everything with the old one: ``reduce`` costs O(log n) per event, and any earlier state stays
valid (a property test keeps every prefix's state and compares it with a re-fold).

Only live work is kept: a group and its requests leave the state when the group enters a batch
or is discarded; a version leaves it when it is retired. The ledger keeps the history.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any, NamedTuple, TypeVar

import immutables

from runtime.controller.spec import ControllerSpec

_NT = TypeVar("_NT", bound=type[NamedTuple])


def _with_evolve(cls: _NT) -> _NT:
    """Give a NamedTuple class ``evolve(**changes)``: a copy with those fields replaced.

    ``_replace`` without its overhead: the fold calls ``evolve`` several times per event. Each
    class also declares ``evolve`` (via ``_replace``) so that its type is known statically.
    """
    index = {name: i for i, name in enumerate(cls._fields)}
    new = tuple.__new__

    def evolve(self, **changes: Any):
        items = list(self)
        for name, value in changes.items():
            items[index[name]] = value
        return new(cls, items)

    evolve.__doc__ = "A copy with ``changes`` applied."
    cls.evolve = evolve  # type: ignore[attr-defined]  # installed on the class at run time
    return cls


@_with_evolve
class Request(NamedTuple):
    """One live rollout request; ``attempts`` counts its leases, ``holder`` has the current one."""

    rollout_id: int
    group_id: int
    policy_version: int
    attempts: int = 0
    holder: str | None = None
    done: bool = False
    reward: float | None = None

    def evolve(self, **changes: Any) -> Request:
        """A copy with ``changes`` applied (``_with_evolve`` installs a faster one)."""
        return self._replace(**changes)


@_with_evolve
class Group(NamedTuple):
    """A live group: ``group_size`` samples of one prompt from one policy version (I3).

    ``uniform`` stays true while every recorded reward equals ``first_reward``.
    """

    group_id: int
    batch: int
    ordinal: int
    prompt_index: int
    policy_version: int
    rollout_ids: tuple[int, ...]
    completed: int = 0
    scored: int = 0
    first_reward: float | None = None
    uniform: bool = True

    def evolve(self, **changes: Any) -> Group:
        """A copy with ``changes`` applied (``_with_evolve`` installs a faster one)."""
        return self._replace(**changes)

    @property
    def resolved(self) -> bool:
        """Every sample completed and scored."""
        return self.scored == len(self.rollout_ids)


@_with_evolve
class Worker(NamedTuple):
    """A joined worker; inference workers hold up to ``slots`` leases, ``active`` of them now."""

    worker_id: str
    role: str
    slots: int
    order: int
    active: int = 0

    def evolve(self, **changes: Any) -> Worker:
        """A copy with ``changes`` applied (``_with_evolve`` installs a faster one)."""
        return self._replace(**changes)


@_with_evolve
class Plan(NamedTuple):
    """Deterministic mode: the groups requested for one batch that is not formed yet.

    ``groups`` are group ids by ordinal; ``good`` and ``uniform`` the ordinals of resolved
    groups with differing and with identical rewards (``uniform`` stays empty unless groups are
    filtered).
    """

    batch: int
    version: int
    groups: tuple[int, ...] = ()
    good: tuple[int, ...] = ()
    uniform: tuple[int, ...] = ()

    def evolve(self, **changes: Any) -> Plan:
        """A copy with ``changes`` applied (``_with_evolve`` installs a faster one)."""
        return self._replace(**changes)

    @property
    def resolved(self) -> int:
        return len(self.good) + len(self.uniform)


EMPTY: immutables.Map = immutables.Map()


@_with_evolve
class ControllerState(NamedTuple):
    """Everything ``decide`` needs, folded from the ledger by ``reduce``.

    Attributes:
        spec: the run's scheduling parameters (None before ``RunStarted``).
        run_id, config_digest: from ``RunStarted``.
        epoch: writer epoch of the newest ``ControllerStarted``.
        finished: ``RunFinished`` was decided.
        next_rollout_id, next_group_id: the next ids to hand out.
        position: the prompt stream's cursor (prompts drawn in order so far).
        requested: deterministic mode: the last batch whose groups were requested.
        label: freshest mode: (batch, ordinal) of the next group; it names the group's seeds.
        formed: the last batch formed (steps consume batches of the same number).
        trained: the last step completed.
        latest: the newest published version, -1 before version 0.
        versions: published, unretired versions and their digests.
        requests, groups: live rollout requests and groups by id.
        plans: deterministic mode: requested, unformed batches.
        ready: freshest mode: resolved groups in the order they resolved.
        pending: unleased live requests, ascending ids (leases go out in id order).
        workers: joined workers by id.
        free: (order, worker id) of inference workers with a free slot, ascending.
        joins: number of joins so far; a worker's ``order``.
        version_refs: live incomplete requests per policy version.
        group_versions: live groups per policy version.
        discards: freshest mode: groups dropped for uniform rewards since the last batch.
        due_evaluations: (version, digest) of published versions due for held-out evaluation
            (``ControllerSpec.evaluated``) and not evaluated yet, ascending. Kept past a
            version's retirement, so a late ``VersionEvaluated`` is still checked against the
            digest that was published.
    """

    spec: ControllerSpec | None = None
    run_id: str = ""
    config_digest: str = ""
    epoch: int = 0
    finished: bool = False
    next_rollout_id: int = 0
    next_group_id: int = 0
    position: int = 0
    requested: int = 0
    label: tuple[int, int] = (1, 0)
    formed: int = 0
    trained: int = 0
    latest: int = -1
    versions: immutables.Map[int, str] = EMPTY
    requests: immutables.Map[int, Request] = EMPTY
    groups: immutables.Map[int, Group] = EMPTY
    plans: immutables.Map[int, Plan] = EMPTY
    ready: tuple[int, ...] = ()
    pending: tuple[int, ...] = ()
    workers: immutables.Map[str, Worker] = EMPTY
    free: tuple[tuple[int, str], ...] = ()
    joins: int = 0
    version_refs: immutables.Map[int, int] = EMPTY
    group_versions: immutables.Map[int, int] = EMPTY
    discards: int = 0
    due_evaluations: tuple[tuple[int, str], ...] = ()

    def evolve(self, **changes: Any) -> ControllerState:
        """A copy with ``changes`` applied (``_with_evolve`` installs a faster one)."""
        return self._replace(**changes)


INITIAL = ControllerState()


def insert_sorted(items: tuple, item) -> tuple:
    """``items`` (ascending) with ``item`` added; unchanged if present."""
    i = bisect_left(items, item)
    if i < len(items) and items[i] == item:
        return items
    return items[:i] + (item,) + items[i:]


def remove_sorted(items: tuple, item) -> tuple:
    """``items`` (ascending) without ``item``; unchanged if absent."""
    i = bisect_left(items, item)
    if i < len(items) and items[i] == item:
        return items[:i] + items[i + 1 :]
    return items

