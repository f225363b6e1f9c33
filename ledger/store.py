"""The append-only event store: the interface every backend implements (``ledger.backends``
opens one).

Semantics (the same for every backend, checked by one contract test suite):

- Each run has a gapless sequence ``seq = 1, 2, …``; ``head(run_id)`` is the last seq (0 when
  empty) and its chain digest.
- ``append(run_id, events, expected_seq=…, epoch=…)`` writes all events or none. It raises
  ``AppendConflict`` when the head is not ``expected_seq`` and ``Fenced`` when ``epoch`` is not
  the run's current writer epoch; in both cases nothing is written.
- ``acquire_epoch(run_id)`` makes the caller the run's only writer (``writer_epoch += 1``): a
  zombie writer holding an older epoch can no longer append.
- Readers see only committed events, in seq order; ``follow`` tails new events as they commit.
- ``verify`` recomputes the hash chain and decodes every body; ``repair`` cuts a torn tail back
  to the last valid event and refuses corruption in the middle unless forced.
- Snapshots (``put_snapshot``/``snapshots``) are opaque blobs a reader of the log may keep beside
  it, each tied to a seq and to the chain digest at that seq; they are not part of the chain, a
  write keeps only the newest few of a run, and cutting the log (``repair``) drops those past the
  cut. What they hold and how they are checked is the writer's business
  (``runtime.controller.snapshot``).
- A store opened ``readonly`` changes nothing: not the data, not the file's journal mode, not
  the schema; every write raises ``ReadOnlyStore``. Inspecting commands open stores this way.
"""

from __future__ import annotations

import abc
import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

from ledger import chain
from ledger.codec import decode_body, encode_event
from ledger.errors import CodecError, CorruptLedger, LedgerError, ReadOnlyStore
from ledger.events import EVENTS, Event, Registry
from ledger.url import resolve_url as resolve_url  # runtime.run imports it from here

SQLITE_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
"""SQLite's ``PRAGMA synchronous`` levels (PostgreSQL always commits with ``synchronous_commit=on``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RawRecord:
    """A stored record exactly as kept: body bytes undecoded."""

    run_id: str
    seq: int
    kind: str
    version: int
    body: bytes
    digest: bytes
    epoch: int
    wall_time: float


@dataclasses.dataclass(frozen=True, slots=True)
class StoredEvent:
    """A decoded event with its position, chain digest and the epoch of the writer."""

    run_id: str
    seq: int
    event: Event
    digest: bytes
    epoch: int
    wall_time: float

    @property
    def kind(self) -> str:
        return self.event.KIND


@dataclasses.dataclass(frozen=True, slots=True)
class StoredSnapshot:
    """A snapshot as kept: an opaque ``body`` of format ``format`` for the prefix up to ``seq``,
    whose chain digest was ``chain_digest`` when it was written; ``checksum`` covers both."""

    run_id: str
    seq: int
    format: int
    chain_digest: bytes
    body: bytes
    checksum: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class Head:
    seq: int
    digest: bytes


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """Result of ``verify`` for one run.

    ``first_bad_seq`` is the first seq that is missing, unreadable, fails the chain or does not
    decode; ``torn_tail`` is true when no valid event follows it (``repair`` may cut it).
    """

    run_id: str
    events: int
    head_seq: int
    head_digest: str
    ok: bool
    first_bad_seq: int | None = None
    reason: str | None = None
    bad_seqs: tuple[int, ...] = ()
    torn_tail: bool = False
    last_good_seq: int = 0

    def raise_if_bad(self) -> None:
        if not self.ok:
            raise CorruptLedger(self.run_id, self.first_bad_seq or 0, self.reason or "corrupt")


@dataclasses.dataclass(frozen=True)
class RepairReport:
    run_id: str
    truncated_from: int | None
    removed: int
    head_seq: int


class EventStore(abc.ABC):
    """Interface and shared logic of the append-only stores."""

    url: str
    registry: Registry = EVENTS
    readonly: bool = False
    """Opened for reading only: every write raises ``ReadOnlyStore`` before touching anything."""

    # -- backend primitives --------------------------------------------------------------------

    @abc.abstractmethod
    def create_run(self, run_id: str) -> None:
        """Register a new, empty run with writer epoch 0 (``RunExists`` if present)."""

    @abc.abstractmethod
    def runs(self) -> list[str]:
        """Run ids in this store, sorted."""

    @abc.abstractmethod
    def acquire_epoch(self, run_id: str) -> int:
        """Increment and return the run's writer epoch, fencing every older writer."""

    @abc.abstractmethod
    def writer_epoch(self, run_id: str) -> int:
        """The run's current writer epoch."""

    @abc.abstractmethod
    def head(self, run_id: str) -> Head:
        """The last committed seq (0 for an empty run) and its digest."""

    @abc.abstractmethod
    def _append_encoded(
        self, run_id: str, records: list[tuple[str, int, bytes]], expected_seq: int, epoch: int
    ) -> Head:
        """Atomically check epoch and head, chain and insert ``records``; return the new head."""

    @abc.abstractmethod
    def scan(self, run_id: str, from_seq: int = 1, to_seq: int | None = None) -> Iterator[RawRecord]:
        """Raw committed records with ``from_seq <= seq <= to_seq`` in seq order."""

    @abc.abstractmethod
    def _truncate(self, run_id: str, from_seq: int) -> int:
        """Delete records with ``seq >= from_seq``; return how many were removed."""

    @abc.abstractmethod
    def stats(self) -> dict:
        """Events by kind, runs, bytes."""

    @abc.abstractmethod
    def _put_snapshot(self, snap: StoredSnapshot, keep: int, before_commit: Callable[[], None] | None) -> None:
        """Atomically store ``snap`` (replacing one at its seq) and drop all but the newest
        ``keep`` snapshots of its run; ``before_commit`` runs inside the transaction."""

    @abc.abstractmethod
    def snapshots(self, run_id: str) -> list[StoredSnapshot]:
        """The run's stored snapshots, newest (highest seq) first; empty for a ledger that has none."""

    def put_snapshot(self, snap: StoredSnapshot, *, keep: int = 3,
                     before_commit: Callable[[], None] | None = None) -> None:
        """Store ``snap`` and keep only the run's ``keep`` newest snapshots, all or nothing."""
        self._writable(f"write a snapshot of run {snap.run_id!r}")
        if keep < 1:
            raise LedgerError(f"keep must be at least 1, got {keep}")
        self._put_snapshot(snap, keep, before_commit)

    def close(self) -> None:  # noqa: B027 - a hook: stores without connections keep it
        """Release connections."""

    def __enter__(self) -> EventStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- shared logic --------------------------------------------------------------------------

    def _writable(self, what: str) -> None:
        """Raise ``ReadOnlyStore`` before a write (``what``) on a store opened read-only."""
        if self.readonly:
            raise ReadOnlyStore(f"ledger {self.url} is opened read-only: cannot {what}")

    def append(self, run_id: str, events: Sequence[Event], *, expected_seq: int, epoch: int) -> Head:
        """Append ``events`` after ``expected_seq`` as writer ``epoch``: all or nothing."""
        self._writable(f"append to run {run_id!r}")
        if not events:
            raise LedgerError("append needs at least one event")
        records = [encode_event(ev) for ev in events]
        return self._append_encoded(run_id, records, int(expected_seq), int(epoch))

    def read(self, run_id: str, from_seq: int = 1, to_seq: int | None = None) -> Iterator[StoredEvent]:
        """Decoded committed events from ``from_seq`` on, in seq order."""
        reg = self.registry
        for r in self.scan(run_id, from_seq, to_seq):
            yield StoredEvent(
                r.run_id, r.seq, decode_body(r.kind, r.version, r.body, reg), r.digest, r.epoch, r.wall_time
            )

    def scan_linked(self, run_id: str, kinds: Iterable[str] | None = None, from_seq: int = 1,
                    to_seq: int | None = None) -> Iterator[tuple[bytes | None, RawRecord]]:
        """Raw records of ``kinds`` (None: all) with ``from_seq <= seq <= to_seq``, each with the
        stored digest of the record before it (``chain.GENESIS`` before seq 1, None when that
        record is absent): enough to check each record against the chain on its own, as
        ``chain.link(prev, r.kind, r.version, r.body) == r.digest``, without reading the rest.

        Backends filter by kind where the records are (SQL stores: in the query), so reading a
        few kinds of a long log never decodes or even fetches the others.
        """
        wanted = None if kinds is None else frozenset(kinds)
        prev_seq, prev = 0, chain.GENESIS
        for r in self.scan(run_id, max(1, from_seq - 1), to_seq):
            if r.seq >= from_seq and (wanted is None or r.kind in wanted):
                yield (prev if prev_seq == r.seq - 1 else None), r
            prev_seq, prev = r.seq, r.digest

    def count(self, run_id: str) -> int:
        """How many records the run holds (its head seq when the log has no gap)."""
        return sum(1 for _ in self.scan(run_id))

    def events(self, run_id: str, from_seq: int = 1) -> list[Event]:
        """The run's events (no envelope) from ``from_seq`` on."""
        return [s.event for s in self.read(run_id, from_seq)]

    def _wait(self, run_id: str, after_seq: int, timeout: float) -> None:
        """Block up to ``timeout`` seconds or until events after ``after_seq`` may exist."""
        time.sleep(timeout)

    def follow(
        self,
        run_id: str,
        from_seq: int = 1,
        *,
        poll_interval: float = 0.05,
        stop: threading.Event | None = None,
        idle_timeout: float | None = None,
    ) -> Iterator[StoredEvent]:
        """Tail the run: yield committed events from ``from_seq`` on as they arrive.

        Ends when ``stop`` is set or after ``idle_timeout`` seconds without a new event.
        Never skips an event: after every wake-up it re-reads from the last seq it yielded.
        """
        next_seq = from_seq
        idle = 0.0
        while stop is None or not stop.is_set():
            got = False
            for s in self.read(run_id, next_seq):
                yield s
                next_seq = s.seq + 1
                got = True
            if got:
                idle = 0.0
                continue
            if idle_timeout is not None and idle >= idle_timeout:
                return
            self._wait(run_id, next_seq - 1, poll_interval)
            idle += poll_interval

    def verify(self, run_id: str, from_seq: int = 1) -> VerifyReport:
        """Recompute the chain and decode every body of ``run_id``.

        With ``from_seq > 1`` only the records from there on are checked, chained from the
        stored digest of ``from_seq - 1`` (an incremental check of a log verified up to there).
        """
        prev = chain.GENESIS
        if from_seq > 1:
            before = list(self.scan(run_id, from_seq - 1, from_seq - 1))
            if not before:
                raise LedgerError(f"cannot verify run {run_id!r} from seq {from_seq}: seq {from_seq - 1} is absent")
            prev = before[0].digest
        expected = from_seq
        count = 0
        bad: list[tuple[int, str]] = []
        last_good = from_seq - 1
        reg = self.registry
        head_digest = prev
        try:
            for r in self.scan(run_id, from_seq):
                count += 1
                if r.seq != expected:
                    bad.append((expected, f"missing seq {expected} (next stored is {r.seq})"))
                    expected = r.seq
                if chain.link(prev, r.kind, r.version, r.body) != r.digest:
                    bad.append((r.seq, "chain digest mismatch (body, kind, version or digest altered)"))
                else:
                    try:
                        decode_body(r.kind, r.version, r.body, reg)
                    except CodecError as e:
                        bad.append((r.seq, f"undecodable body: {e}"))
                    else:
                        last_good = r.seq
                prev = r.digest
                head_digest = r.digest
                expected = r.seq + 1
        except LedgerError as e:
            bad.append((expected, f"unreadable: {e}"))
        if not bad:
            return VerifyReport(run_id, count, expected - 1, head_digest.hex(), True, last_good_seq=last_good)
        first, reason = bad[0]
        return VerifyReport(
            run_id,
            count,
            expected - 1,
            head_digest.hex(),
            False,
            first_bad_seq=first,
            reason=reason,
            bad_seqs=tuple(s for s, _ in bad[:100]),
            torn_tail=last_good < first,
            last_good_seq=last_good,
        )

    def repair(self, run_id: str, *, force: bool = False) -> RepairReport:
        """Cut a torn tail back to the last valid event.

        Corruption followed by valid events is refused (``CorruptLedger``) unless ``force``, in
        which case everything from the first bad seq on is removed.
        """
        self._writable(f"repair run {run_id!r}")
        report = self.verify(run_id)
        if report.ok:
            return RepairReport(run_id, None, 0, report.head_seq)
        first = report.first_bad_seq
        assert first is not None
        if not report.torn_tail and not force:
            raise CorruptLedger(
                run_id,
                first,
                f"{report.reason}; valid events follow (up to seq {report.last_good_seq}), so this "
                "is corruption in the middle, not a torn tail: refusing to repair without --force",
            )
        removed = self._truncate(run_id, first)
        return RepairReport(run_id, first, removed, first - 1)


def append_chain(prev: bytes, start_seq: int, records: Iterable[tuple[str, int, bytes]]) -> list[tuple[int, str, int, bytes, bytes]]:
    """``(seq, kind, version, body, digest)`` rows chained after ``prev`` starting at ``start_seq``."""
    out = []
    seq = start_seq
    for kind, version, body in records:
        prev = chain.link(prev, kind, version, body)
        out.append((seq, kind, version, body, prev))
        seq += 1
    return out
