"""Replay: fold a ledger while checking every logged decision against a re-run of ``decide``.

The I/O loop appends a run of inputs and then ``decide`` of the state after them, to a fixpoint.
So a valid ledger alternates *input runs* and *decision runs* (event kinds are one or the other,
see ``admit.DECISION_KINDS``), and

- at the start of every decision run, ``decide(state)`` equals the logged run, event by event;
- at the end of the ledger, ``decide(state)`` is empty (the loop appends decisions in the same
  transaction as the inputs that caused them, so no complete ledger ends before them).

The first disagreement raises :class:`ReplayDivergence` with the seq, the kind and the first
differing field, like Temporal's non-determinism error but comparing payloads too (I6).

A decision that names several rollouts (a group's ``RolloutRequested``, a worker's
``RolloutAssigned``) matches logged events that split it into consecutive parts in order:
ledgers written when each of these events named one rollout replay and resume unchanged, and
the parts fold to the same state as the whole.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from ledger import events as ev
from ledger.store import StoredEvent
from runtime.controller.admit import DECISION_KINDS
from runtime.controller.decide import decide, decide_and_fold
from runtime.controller.reduce import Folder, InvalidEvent
from runtime.controller.state import INITIAL, ControllerState
from runtime.errors import RlxError


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


class ReplayDivergence(RlxError):
    """The ledger is not what the controller decides: ``seq``, ``kind`` and ``field`` say where.

    ``logged`` and ``decided`` are the two values of ``field`` (an event kind when ``field``
    is ``"kind"``; None where one side has no event).
    """

    def __init__(self, seq: int, kind: str, field: str, logged: Any, decided: Any, detail: str = ""):
        self.seq, self.kind, self.field = seq, kind, field
        self.logged, self.decided = logged, decided
        what = detail or f"field {field!r}: logged {_short(logged)}, decided {_short(decided)}"
        super().__init__(f"replay diverges at seq {seq} ({kind}): {what}")


def _stored(events: Iterable[ev.Event | StoredEvent]) -> Iterable[tuple[int, ev.Event]]:
    for i, item in enumerate(events, start=1):
        if isinstance(item, StoredEvent):
            yield item.seq, item.event
        else:
            yield i, item


def replay(events: Iterable[ev.Event | StoredEvent], *, state: ControllerState = INITIAL,
           check: bool = True) -> ControllerState:
    """Fold ``events`` (plain events numbered from 1, or stored events with their seqs).

    With ``check`` every decision run is compared with ``decide``; without it this is a plain
    fold that still rejects events that cannot apply. Returns the final state.

    Raises:
        ReplayDivergence: a logged decision differs from the decided one, a decision is missing
            or extra, or an event cannot follow the state before it (field ``"event"``).
    """
    if not check:
        return _fold(events, state)
    # In a decision run, the logged events are compared with ``decide``; when the whole run
    # matches, the state after it is the one ``decide_and_fold`` computed, so they are not
    # folded a second time.
    expected: list[ev.Event] | None = None  # decide() at the start of the current decision run
    after = state  # the state after all of ``expected``
    folder = Folder(state)  # folds the current input run
    cursor = 0
    seq = 0
    for seq, event in _stored(events):
        if type(event) in DECISION_KINDS:
            if expected is None:
                expected, after = decide_and_fold(folder.state())
                cursor = 0
            if cursor >= len(expected):
                raise ReplayDivergence(seq, event.KIND, "kind", event.KIND, None,
                                       f"logged {event.KIND} was not decided (decide had {len(expected)} events here)")
            want = expected[cursor]
            field = event.first_difference(want)
            if (field is not None and isinstance(event, _SPLIT_KINDS) and isinstance(want, _SPLIT_KINDS)
                    and type(want) is type(event)):
                parts = _split(want, len(event.rollout_ids))
                if parts is not None:
                    want = parts[0]
                    field = event.first_difference(want)
                    if field is None:
                        expected[cursor:cursor + 1] = parts
            if field == "KIND":
                raise ReplayDivergence(seq, event.KIND, "kind", event.KIND, want.KIND)
            if field is not None:
                raise ReplayDivergence(seq, event.KIND, field, getattr(event, field), getattr(want, field))
            cursor += 1
            continue
        if expected is not None:
            _missing(seq, event, expected, cursor)
            expected, folder = None, Folder(after)
        _apply(folder, seq, event)
    if expected is not None:
        _missing(seq + 1, None, expected, cursor)
        return after
    state = folder.state()
    tail = decide(state)
    if tail:
        _missing(seq + 1, None, tail, 0)
    return state


_SPLITTABLE = {ev.RolloutRequested: ("rollout_ids", "seeds"), ev.RolloutAssigned: ("rollout_ids", "attempts")}
_SPLIT_KINDS = (ev.RolloutRequested, ev.RolloutAssigned)


def _split(decided: ev.RolloutRequested | ev.RolloutAssigned, n: int) -> tuple[ev.Event, ev.Event] | None:
    """``decided`` as its first ``n`` rollouts and the rest, or None if ``n`` does not split it."""
    if not 0 < n < len(decided.rollout_ids):
        return None
    names = _SPLITTABLE[type(decided)]
    first: dict[str, Any] = {name: tuple(getattr(decided, name)[:n]) for name in names}
    rest: dict[str, Any] = {name: tuple(getattr(decided, name)[n:]) for name in names}
    return dataclasses.replace(decided, **first), dataclasses.replace(decided, **rest)


def _apply(folder: Folder, seq: int, event: ev.Event) -> None:
    try:
        folder.apply(event)
    except InvalidEvent as e:
        raise ReplayDivergence(seq, event.KIND, "event", event.KIND, None, str(e)) from None


def _fold(events: Iterable[ev.Event | StoredEvent], state: ControllerState) -> ControllerState:
    folder = Folder(state)
    for seq, event in _stored(events):
        _apply(folder, seq, event)
    return folder.state()


def _missing(seq: int, event: ev.Event | None, expected: list[ev.Event], cursor: int) -> None:
    if cursor < len(expected):
        want = expected[cursor]
        at = f"before {event.KIND}" if event is not None else "at the end of the ledger"
        raise ReplayDivergence(
            seq, event.KIND if event is not None else "end", "kind", event.KIND if event is not None else None,
            want.KIND, f"decided {want.KIND} ({len(expected) - cursor} decisions) missing {at}",
        )
