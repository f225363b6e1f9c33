"""One audit query answered from the events it needs, not from the whole run.

A run of the built-in demo holds about a million events, nearly all of them the completions and
outcomes of its rollouts; a query (``rlx audit DIR version V | rollout ID | step S``) needs the
life of a few hundred rollouts at most. :func:`query_events` reads:

1. the run's *spine* (:data:`SPINE`): every event of the kinds that name versions, steps and
   groups (under 1% of a demo's events), which the database selects by kind, and the requests
   of the rollouts the query is about: for a version's batch, read back from its
   ``BatchFormed`` until each is found; for one rollout, every request of the run;
2. the rollouts the query is about (the batch of step ``V``, or rollout ``ID``), and for each the
   seqs where the fold admits events about it: from its request to the event that takes its
   group out of the controller's state (the ``BatchFormed`` that consumes it or the
   ``GroupDiscarded``; the end of the log while it is live). ``runtime.controller.admit`` refuses
   a completion, outcome, lease or abandonment of a rollout outside that span, so every event of
   :data:`LIFE` about it lies there; only those seq ranges are read.

Every record read is checked against the hash chain on its own (its stored digest is the link
of the stored digest before it and its body) and the run's seqs are checked to be gapless, so a
record that was altered, torn or removed is refused as before; ``rlx audit DIR check`` and
``rlx ledger verify`` recompute the whole chain. The answers equal those of
:meth:`Provenance.from_events` over every event of the run (``tests/runtime/test_audit_index.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from ledger import chain
from ledger import events as ev
from ledger.codec import decode_body
from ledger.errors import CodecError, CorruptLedger
from ledger.store import EventStore, StoredEvent
from runtime.audit.provenance import Provenance

SPINE = ("RunStarted", "RolloutRequested", "GroupDiscarded", "BatchFormed", "TrainStepCompleted",
         "WeightsPublished", "VersionsRetired", "VersionEvaluated")
"""Kinds of the version, step, group and request records (requests only as far as needed)."""
LIFE = ("RolloutAssigned", "RolloutAbandoned", "RolloutCompleted", "OutcomeRecorded")
"""Kinds about single rollouts, read only over the seqs of the rollouts a query is about."""
QUERIES = ("version", "rollout", "step")


def _checked(store: EventStore, run_id: str, kinds: Iterable[str], from_seq: int = 1,
             to_seq: int | None = None) -> list[StoredEvent]:
    """The decoded events of ``kinds`` in the range, each checked against the chain."""
    out = []
    for prev, r in store.scan_linked(run_id, kinds, from_seq, to_seq):
        if prev is None:
            raise CorruptLedger(run_id, r.seq - 1, f"missing seq {r.seq - 1} (next stored is {r.seq})")
        if chain.link(prev, r.kind, r.version, r.body) != r.digest:
            raise CorruptLedger(run_id, r.seq, "chain digest mismatch (body, kind, version or digest altered)")
        try:
            e = decode_body(r.kind, r.version, r.body, store.registry)
        except CodecError as err:
            raise CorruptLedger(run_id, r.seq, f"undecodable body: {err}") from None
        out.append(StoredEvent(run_id, r.seq, e, r.digest, r.epoch, r.wall_time))
    return out


def _check_gapless(store: EventStore, run_id: str, head: int) -> None:
    """Raise ``CorruptLedger`` unless the run holds every seq up to ``head``."""
    count = store.count(run_id)
    if count < head:
        raise CorruptLedger(run_id, head, f"the run holds {count} records up to seq {head}: some seqs are missing")


def read_kinds(store: EventStore, run_id: str, kinds: Iterable[str]) -> list[StoredEvent]:
    """Every event of ``kinds`` in the run, each checked against the chain, the run's seqs checked
    gapless: what a question about a few kinds (``rlx audit DIR layout``) reads of a long log.

    Raises:
      CorruptLedger: as :func:`query_events`.
    """
    head = store.head(run_id).seq
    events = _checked(store, run_id, kinds, 1, head)
    _check_gapless(store, run_id, head)
    return events


def _spans(spine: list[StoredEvent], rollouts: set[int], head: int) -> list[tuple[int, int]]:
    """Merged seq ranges from each rollout's first request to its group's exit (or ``head``)."""
    start: dict[int, int] = {}
    group_of: dict[int, int] = {}
    end: dict[int, int] = {}
    exits: dict[int, int] = {}  # group -> seq of the first event that took it out of the state
    for s in spine:
        e = s.event
        if type(e) is ev.RolloutRequested:
            for rid in e.rollout_ids:
                if rid in rollouts and rid not in start:
                    start[rid], group_of[rid] = s.seq, e.group_id
        elif type(e) is ev.BatchFormed:
            for rid in e.rollout_ids:
                if rid in rollouts:
                    end.setdefault(rid, s.seq)
        elif type(e) is ev.GroupDiscarded:
            exits.setdefault(e.group_id, s.seq)
    spans = sorted((seq, min(end.get(rid, head), exits.get(group_of[rid], head))) for rid, seq in start.items())
    merged: list[tuple[int, int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _subjects(spine: list[StoredEvent], what: str, n: int) -> set[int]:
    """The rollouts query ``what n`` reports on."""
    if what == "rollout":
        return {n}
    if what == "version":
        batch = next((s.event for s in spine if type(s.event) is ev.BatchFormed and s.event.step == n), None)
        return set() if batch is None else {int(r) for r in batch.rollout_ids}
    return set()


def _requests(store: EventStore, run_id: str, subjects: set[int], below: int) -> list[StoredEvent]:
    """The requests of ``subjects``, all made before seq ``below``: read back from there in
    growing seq ranges until every subject's is found (the controller requests each rollout id
    once, so the nearest is the only one), not over the whole run."""
    found: list[StoredEvent] = []
    missing = set(subjects)
    hi, width = below - 1, 4096
    while missing and hi >= 1:
        lo = max(1, hi - width + 1)
        chunk = [(s, s.event.rollout_ids) for s in _checked(store, run_id, ("RolloutRequested",), lo, hi)
                 if type(s.event) is ev.RolloutRequested]
        found += [s for s, ids in chunk if not missing.isdisjoint(ids)]
        for _, ids in chunk:
            missing.difference_update(ids)
        hi, width = lo - 1, width * 2
    return found


def query_events(store: EventStore, run_id: str, what: str, n: int) -> Provenance:
    """The provenance index query ``what n`` (one of :data:`QUERIES`) needs, read from ``store``.

    Raises:
      CorruptLedger: a record read fails its chain link or does not decode, or the run's seqs
        have a gap.
    """
    if what not in QUERIES:
        raise ValueError(f"unknown audit query {what!r}; known: {', '.join(QUERIES)}")
    head = store.head(run_id).seq
    spine = _checked(store, run_id, [k for k in SPINE if k != "RolloutRequested"], 1, head)
    subjects = _subjects(spine, what, n)
    if what == "rollout":  # its request names its group; where it is, only the requests say
        spine = sorted(spine + _checked(store, run_id, ("RolloutRequested",), 1, head), key=lambda s: s.seq)
    elif subjects:  # a batch's rollouts were requested before it was formed
        formed = next(s.seq for s in spine if type(s.event) is ev.BatchFormed and s.event.step == n)
        spine = sorted(spine + _requests(store, run_id, subjects, formed), key=lambda s: s.seq)
    life: list[StoredEvent] = []
    for lo, hi in _spans(spine, subjects, head):
        life += _checked(store, run_id, LIFE, lo, hi)
    _check_gapless(store, run_id, head)
    prov = Provenance.from_events(sorted(spine + life, key=lambda s: s.seq), rollouts=subjects)
    if what == "rollout" and n not in prov.requests:  # say which rollouts there are
        ids = frozenset(rid for s in spine if type(s.event) is ev.RolloutRequested for rid in s.event.rollout_ids)
        prov = dataclasses.replace(prov, requested_ids=ids)
    return prov
