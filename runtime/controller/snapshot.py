"""Controller snapshots: the folded state at a seq, so that a resume folds only the tail.

Where they live: in the ledger store itself, in a table of their own (``rlx_snapshots``; a list
beside the log in the memory store), not as events and not in a separate file. Not as events,
because an event is part of the chain and of every replay: a snapshot would then be history that
``decide`` never produced, and skipping a bad one would mean rewriting the log. Not in a file,
because a run's ledger may be a PostgreSQL database with no run directory (``rlx controller``),
and one store keeps the log and what summarises it together (copied, backed up and repaired
together). ``repair`` drops the snapshots past the cut; a write keeps only the run's newest
:data:`KEPT`.

What a snapshot holds, at a transaction boundary (the head right after an append, where
``decide`` has reached its fixpoint, so a checked replay can start from it): every field of the
:class:`ControllerState` and the :class:`RolloutCache` (the payloads live work needs), as plain
values packed with the ledger's canonical msgpack codec under a format number
(:data:`FORMAT`). Events in the cache are kept as their stored ``(kind, version, body)``, so old
event schemas are upcast on load exactly as when the log is read.

How it is trusted: the log commits to it. The controller stores a snapshot together with a
:class:`~ledger.events.SnapshotTaken` event that names the sha256 of its body, and the snapshot
sits at that event's own seq (the event changes no state, so the fold there is the fold before
it). The row names that seq and the chain digest there; a checksum ``sha256(chain digest ‖ body)``
catches a torn or flipped row. The checksum has no key, so whoever can write the database can
rewrite a row and its checksum; the commitment is in the hash chain, so a rewritten row no longer
matches the log unless the log is rewritten too (which a checked replay of the decisions and
``rlx ledger verify``'s proof of every commitment against the fold then see). On load the newest
snapshot is used whose format this software reads, whose checksum holds, whose chain digest is
the one stored at its seq, whose body is the one the ``SnapshotTaken`` there commits to, and that
decodes: one read of one event and a hash; any other (a forged row, or one written before
snapshots were committed) is skipped with a warning and the next older one tried, down to seq 1.
The log is then verified incrementally: the tail from the snapshot's seq on is chained from the
digest stored there and decoded while it is folded, in one pass (``rlx ledger verify`` still
checks the whole chain, and proves every stored snapshot, every commitment and every snapshot a
``ControllerStarted`` says it resumed from against the fold).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import immutables

from ledger import chain
from ledger import events as ev
from ledger.codec import decode_body, encode_event, encode_map_body, pack, unpack
from ledger.errors import CodecError, CorruptLedger
from ledger.store import EventStore, Head, RawRecord, StoredEvent, StoredSnapshot
from runtime.controller.cache import RolloutCache
from runtime.controller.replay import ReplayDivergence, replay
from runtime.controller.spec import ControllerSpec
from runtime.controller.state import INITIAL, ControllerState, Group, Plan, Request, Worker

FORMAT = 1
"""The layout of a snapshot body; a body of another format is skipped (written by other software)."""
KEPT = 3
"""Snapshots kept per run: the newest, and older ones to fall back on if it is unusable."""

Warn = Callable[[str], None]

_MAPS: dict[str, type | None] = {
    "versions": None, "requests": Request, "groups": Group, "plans": Plan, "workers": Worker,
    "version_refs": None, "group_versions": None,
}


class SnapshotUnreadable(Exception):
    """A snapshot body that does not decode to a state and cache."""


def checksum(chain_digest: bytes, body: bytes) -> bytes:
    return hashlib.sha256(chain_digest + body).digest()


def body_digest(body: bytes) -> str:
    """The sha256 of a snapshot body in hex: what ``SnapshotTaken`` and ``ControllerStarted`` record."""
    return hashlib.sha256(body).hexdigest()


# -- encoding ---------------------------------------------------------------------------------------


def _event(e: ev.Event) -> list:
    # Format 1 keeps events as the map bodies it was defined with, so the snapshots of every
    # ledger, older ones included, are still proved byte for byte against the fold.
    return [e.KIND, e.VERSION, encode_map_body(e)]


def encode(state: ControllerState, cache: RolloutCache) -> bytes:
    """The canonical body of a snapshot of ``state`` and ``cache`` (dict orders kept as lists)."""
    s: dict[str, Any] = {}
    value: Any
    for name, value in zip(ControllerState._fields, state, strict=True):
        if name in _MAPS:
            cls = _MAPS[name]
            s[name] = [[k, list(v) if cls is not None else v] for k, v in sorted(value.items())]
        elif name == "spec":
            s[name] = None if value is None else list(value)
        else:
            s[name] = value
    c = {
        "requests": [list(q) for q in cache.requests.values()],
        "completions": [_event(e) for e in cache.completions.values()],
        "outcomes": [_event(e) for e in cache.outcomes.values()],
        "unscored": list(cache.unscored),
        "batches": [_event(e) for e in cache.batches.values()],
        "groups": [[gid, rids] for gid, rids in cache._groups.items()],
    }
    return pack({"format": FORMAT, "state": s, "cache": c})


_E = TypeVar("_E", bound=ev.Event)


def _decode_events(items: Any, cls: type[_E]) -> list[_E]:
    out = []
    for kind, version, body in items:
        e = decode_body(kind, version, body)
        if not isinstance(e, cls):
            raise SnapshotUnreadable(f"a {kind} event where a {cls.KIND} was expected")
        out.append(e)
    return out


def decode(body: bytes) -> tuple[ControllerState, RolloutCache]:
    """Inverse of :func:`encode`; raises :class:`SnapshotUnreadable`."""
    try:
        doc = unpack(body)
        if doc.get("format") != FORMAT:
            raise SnapshotUnreadable(f"format {doc.get('format')!r}, this software reads {FORMAT}")
        s, c = doc["state"], doc["cache"]
        if set(s) != set(ControllerState._fields):
            raise SnapshotUnreadable(f"state fields {sorted(s)} are not {sorted(ControllerState._fields)}")
        fields: dict[str, Any] = {}
        for name in ControllerState._fields:
            value = s[name]
            if name in _MAPS:
                cls = _MAPS[name]
                value = immutables.Map((k, cls(*v) if cls is not None else v) for k, v in value)
            elif name == "spec":
                value = None if value is None else ControllerSpec(*value)
            fields[name] = value
        state = ControllerState(**fields)
        cache = RolloutCache()
        cache.requests = {q[0]: ev.SampleRequest(*q) for q in c["requests"]}
        cache.completions = {e.rollout_id: e for e in _decode_events(c["completions"], ev.RolloutCompleted)}
        cache.outcomes = {e.rollout_id: e for e in _decode_events(c["outcomes"], ev.OutcomeRecorded)}
        cache.unscored = dict.fromkeys(c["unscored"])
        cache.batches = {e.step: e for e in _decode_events(c["batches"], ev.BatchFormed)}
        cache._groups = {gid: list(rids) for gid, rids in c["groups"]}
    except SnapshotUnreadable:
        raise
    except (CodecError, AttributeError, KeyError, TypeError, ValueError) as e:
        raise SnapshotUnreadable(f"{type(e).__name__}: {e}") from None
    return state, cache


def write(store: EventStore, run_id: str, seq: int, chain_digest: bytes, state: ControllerState,
          cache: RolloutCache, *, keep: int = KEPT, before_commit: Callable[[], None] | None = None) -> StoredSnapshot:
    """Store a snapshot of ``state`` and ``cache``, the fold of the log up to ``seq``."""
    body = encode(state, cache)
    snap = StoredSnapshot(run_id, seq, FORMAT, chain_digest, body, checksum(chain_digest, body))
    store.put_snapshot(snap, keep=keep, before_commit=before_commit)
    return snap


def commit(store: EventStore, run_id: str, head: Head, epoch: int, state: ControllerState, cache: RolloutCache,
           *, keep: int = KEPT, before_commit: Callable[[], None] | None = None) -> tuple[StoredSnapshot, Head]:
    """Store a snapshot of ``state`` and ``cache`` (the fold of the log up to ``head``) and commit
    to it in the log: the row first, at the seq and chain digest its ``SnapshotTaken`` will have,
    then that event, appended after ``head`` as writer ``epoch``. A failure between the two leaves
    a row the log does not commit to, which a resume skips.

    Raises:
        Fenced, AppendConflict: another writer holds the run (the row is then not trusted).
        LedgerError, OSError: the row or the event could not be written.
    """
    body = encode(state, cache)
    taken = ev.SnapshotTaken(body_digest(body), FORMAT)
    kind, version, event_body = encode_event(taken)
    seq, digest = head.seq + 1, chain.link(head.digest, kind, version, event_body)
    snap = StoredSnapshot(run_id, seq, FORMAT, digest, body, checksum(digest, body))
    store.put_snapshot(snap, keep=keep, before_commit=before_commit)
    return snap, store.append(run_id, [taken], expected_seq=head.seq, epoch=epoch)


# -- recovery ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class Recovered:
    """The fold of a run's log up to ``seq`` (chain digest ``digest``): state and cache.

    ``snapshot_seq`` is the seq of the snapshot the fold started from (0: from seq 1) and
    ``snapshot_digest`` the sha256 of its body (``""``: none); ``folded`` the number of events
    folded on top of it. The cache is mutable: whoever continues
    from a ``Recovered`` takes it over.
    """

    seq: int
    digest: bytes
    state: ControllerState
    cache: RolloutCache
    snapshot_seq: int = 0
    folded: int = 0
    snapshot_digest: str = ""


def _genesis() -> Recovered:
    return Recovered(0, chain.GENESIS, INITIAL, RolloutCache())


def _usable(store: EventStore, run_id: str, snap: StoredSnapshot) -> RawRecord:
    """The log's record at ``snap.seq``, or :class:`SnapshotUnreadable`: a format this software
    does not read, a checksum that does not hold, or a chain digest not the log's there."""
    if snap.format != FORMAT:
        raise SnapshotUnreadable(f"it has format {snap.format}, this software reads format {FORMAT}")
    if checksum(snap.chain_digest, snap.body) != snap.checksum:
        raise SnapshotUnreadable("its checksum does not match its contents (corrupted)")
    at = list(store.scan(run_id, snap.seq, snap.seq))
    if not at:
        raise SnapshotUnreadable(f"the log has no seq {snap.seq}")
    if at[0].digest != snap.chain_digest:
        raise SnapshotUnreadable(f"its chain digest is not the one stored at seq {snap.seq}")
    return at[0]


def check(store: EventStore, run_id: str, snap: StoredSnapshot) -> Recovered:
    """``snap`` as a :class:`Recovered`, or :class:`SnapshotUnreadable` saying why it cannot be
    used: unusable (see :func:`_usable`), not the body the log commits to at its seq, or not
    decodable."""
    _committed(store, _usable(store, run_id, snap), snap)
    state, cache = decode(snap.body)
    return Recovered(snap.seq, snap.chain_digest, state, cache, snapshot_seq=snap.seq,
                     snapshot_digest=body_digest(snap.body))


def _committed(store: EventStore, record: RawRecord, snap: StoredSnapshot) -> None:
    """Raise :class:`SnapshotUnreadable` unless ``record`` (the log at ``snap.seq``) is the
    ``SnapshotTaken`` that commits to ``snap``'s body."""
    if record.kind != ev.SnapshotTaken.KIND:
        raise SnapshotUnreadable(f"the log does not commit to it (seq {snap.seq} is a {record.kind}, not a "
                                 "SnapshotTaken: a row written outside the controller, or before snapshots were "
                                 "committed)")
    try:
        taken = decode_body(record.kind, record.version, record.body, store.registry)
    except CodecError as e:
        raise SnapshotUnreadable(f"the SnapshotTaken at seq {snap.seq} does not decode: {e}") from None
    assert isinstance(taken, ev.SnapshotTaken)
    digest = body_digest(snap.body)
    if taken.digest != digest or taken.format != snap.format:
        raise SnapshotUnreadable(f"its body (sha256 {digest[:16]}…) is not the one the log commits to at seq "
                                 f"{snap.seq} (sha256 {taken.digest[:16]}…): the row was rewritten")


def newest(store: EventStore, run_id: str, warn: Warn | None = None) -> Recovered:
    """The newest usable snapshot of the run (see the module docstring), or the empty fold."""
    for snap in store.snapshots(run_id):
        try:
            return check(store, run_id, snap)
        except SnapshotUnreadable as e:
            if warn is not None:
                warn(f"warning: ignoring the snapshot of run {run_id!r} at seq {snap.seq}: {e}")
    return _genesis()


def _verified(store: EventStore, run_id: str, start: Recovered, into: Recovered) -> Iterator[StoredEvent]:
    """The events after ``start``, each checked against the chain and decoded, observed by
    ``into.cache``; ``into`` tracks the last one. Raises ``CorruptLedger``."""
    prev, expected = start.digest, start.seq + 1
    reg = store.registry
    observe = into.cache.observe
    for r in store.scan(run_id, expected):
        if r.seq != expected:
            raise CorruptLedger(run_id, expected, f"missing seq {expected} (next stored is {r.seq})")
        if chain.link(prev, r.kind, r.version, r.body) != r.digest:
            raise CorruptLedger(run_id, r.seq, "chain digest mismatch (body, kind, version or digest altered)")
        try:
            e = decode_body(r.kind, r.version, r.body, reg)
        except CodecError as err:
            raise CorruptLedger(run_id, r.seq, f"undecodable body: {err}") from None
        observe(e)
        prev, expected = r.digest, r.seq + 1
        into.seq, into.digest = r.seq, r.digest
        into.folded += 1
        yield StoredEvent(run_id, r.seq, e, r.digest, r.epoch, r.wall_time)


def recover(store: EventStore, run_id: str, *, start: Recovered | None = None, snapshots: bool = True,
            check: bool = True, warn: Warn | None = None) -> Recovered:
    """Fold the run's log to its head in one pass over the tail.

    From ``start`` if given, else from the newest usable snapshot (with ``snapshots``), else from
    seq 1. Every event of the tail is chained, decoded and folded (with ``check``, decisions
    compared with ``decide``: the fold starts at a transaction boundary).

    Raises:
        CorruptLedger: the tail fails the chain or does not decode.
        ReplayDivergence: a logged decision differs from ``decide``, or an event cannot apply.
    """
    begin = start if start is not None else newest(store, run_id, warn) if snapshots else _genesis()
    out = Recovered(begin.seq, begin.digest, begin.state, begin.cache, begin.snapshot_seq, begin.folded,
                    begin.snapshot_digest)
    out.state = replay(_verified(store, run_id, begin, out), state=begin.state, check=check)
    return out


def fold_prefix(store: EventStore, run_id: str, seq: int) -> Recovered:
    """The fold of seq 1..``seq`` (no snapshot), e.g. to prove a snapshot equals it."""
    out = _genesis()
    out.state = replay(_upto(_verified(store, run_id, _genesis(), out), seq), check=False)
    return out


def fold_to(store: EventStore, run_id: str, seq: int, warn: Warn | None = None) -> tuple[Recovered, StoredSnapshot | None]:
    """The fold of seq 1..``seq`` from the newest usable snapshot at or before ``seq`` (or from
    seq 1), without decision checks, and that snapshot (None if none): where a fork
    (``runtime.fork``) cuts a log, which its own resume can start from too."""
    for snap in store.snapshots(run_id):
        if snap.seq > seq:
            continue
        try:
            begin = check(store, run_id, snap)
        except SnapshotUnreadable as e:
            if warn is not None:
                warn(f"warning: ignoring the snapshot of run {run_id!r} at seq {snap.seq}: {e}")
            continue
        out = Recovered(begin.seq, begin.digest, begin.state, begin.cache, begin.snapshot_seq, begin.folded,
                        begin.snapshot_digest)
        if seq > begin.seq:
            out.state = replay(_upto(_verified(store, run_id, begin, out), seq), state=begin.state, check=False)
        return out, snap
    return fold_prefix(store, run_id, seq), None


def _upto(items: Iterator[StoredEvent], seq: int) -> Iterator[StoredEvent]:
    for item in items:
        yield item
        if item.seq >= seq:
            return


# -- proof ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Proof:
    """Whether the snapshot at ``seq`` equals the fold of the log up to ``seq``.

    ``by`` is 0 for a stored row, else the seq of the event that names the snapshot's body digest:
    its ``SnapshotTaken`` (at ``seq`` itself) or a ``ControllerStarted`` that says it resumed from
    it. ``reason`` says why not: an unusable row (see :func:`_usable`), the first part of the
    state or cache that differs, or a named digest that is not the fold's.
    """

    seq: int
    ok: bool
    reason: str = ""
    by: int = 0


def _claims(store: EventStore, run_id: str) -> list[tuple[int, int, str, str]]:
    """``(snapshot seq, naming seq, body digest, kind)`` for every ``SnapshotTaken`` of the run and
    every ``ControllerStarted`` that resumed from a snapshot, in log order."""
    out = []
    reg = store.registry
    for r in store.scan(run_id):
        if r.kind not in (ev.SnapshotTaken.KIND, ev.ControllerStarted.KIND):
            continue
        try:
            e = decode_body(r.kind, r.version, r.body, reg)
        except CodecError as err:
            raise CorruptLedger(run_id, r.seq, f"undecodable body: {err}") from None
        if isinstance(e, ev.SnapshotTaken):
            out.append((r.seq, r.seq, e.digest, e.KIND))
        elif isinstance(e, ev.ControllerStarted) and e.snapshot_seq > 0:
            out.append((e.snapshot_seq, r.seq, e.snapshot_digest, e.KIND))
    return out


def prove(store: EventStore, run_id: str, *, check_decisions: bool = True,
          snapshots: bool = True) -> tuple[Recovered, list[Proof]]:
    """Fold the whole log from seq 1 in one streaming pass (every event chained and decoded,
    with ``check_decisions`` every decision compared with ``decide``) and, with ``snapshots``,
    compare each stored snapshot with the fold at its seq, byte for byte (the encoding is
    canonical), and the body digest that each ``SnapshotTaken`` and each resuming
    ``ControllerStarted`` names with the digest of the fold there (a row pruned since, or rewritten
    with its commitment, is still proven). Memory is bounded by the state and the live payloads,
    not by the log.

    Raises:
        CorruptLedger: the log fails the chain or does not decode.
        ReplayDivergence: a logged decision differs from ``decide``, or an event cannot apply.
    """
    out = _genesis()
    proofs: list[Proof] = []
    rows = {s.seq: s for s in store.snapshots(run_id)} if snapshots else {}
    claims = _claims(store, run_id) if snapshots else []
    for at in sorted({*rows, *(c[0] for c in claims)}):
        if at > out.seq:
            out.state = replay(_upto(_verified(store, run_id, out, out), at), state=out.state, check=check_decisions)
        named = [c for c in claims if c[0] == at]
        if out.seq != at:
            proofs += [Proof(at, False, f"the log ends at seq {out.seq}", by) for _, by, _, _ in named]
            if at in rows:
                proofs.append(Proof(at, False, f"the log ends at seq {out.seq}"))
            continue
        folded = encode(out.state, out.cache)
        if at in rows:
            proofs.append(_prove_row(store, run_id, rows[at], folded))
        digest = body_digest(folded)
        for _, by, claimed, kind in named:
            proofs.append(Proof(at, True, by=by) if claimed == digest else Proof(
                at, False, f"the {kind} at seq {by} names a snapshot body with sha256 {claimed[:16]}…, but the fold's "
                           f"is {digest[:16]}…", by))
    out.state = replay(_verified(store, run_id, out, out), state=out.state, check=check_decisions)
    return out, proofs


def _prove_row(store: EventStore, run_id: str, snap: StoredSnapshot, folded: bytes) -> Proof:
    try:
        _usable(store, run_id, snap)
    except SnapshotUnreadable as e:
        return Proof(snap.seq, False, str(e))
    if folded == snap.body:
        return Proof(snap.seq, True)
    return Proof(snap.seq, False, _first_difference(unpack(snap.body), unpack(folded)))


def _first_difference(stored: dict, folded: dict) -> str:
    for part in ("state", "cache"):
        for name in sorted(set(stored[part]) | set(folded[part])):
            if stored[part].get(name) != folded[part].get(name):
                return f"its {part} field {name!r} differs from the fold's"
    return "its encoding differs from the fold's"


def proofs(store: EventStore, run_id: str) -> list[Proof]:
    """:func:`prove` of every stored snapshot and every snapshot the log names, without the
    decision checks (``rlx ledger verify``); no fold at all when there is nothing to prove. A log
    that cannot be folded to a snapshot proves none: one failed :class:`Proof` at seq 0 says why."""
    if not store.snapshots(run_id) and not _claims(store, run_id):
        return []
    try:
        return prove(store, run_id, check_decisions=False)[1]
    except (CorruptLedger, ReplayDivergence) as e:
        return [Proof(0, False, f"the log does not fold: {e}")]
