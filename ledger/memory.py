"""An in-memory event store with the same semantics as the durable ones (for tests and tools)."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterator

from ledger import chain
from ledger.errors import AppendConflict, Fenced, LedgerError, RunExists, RunNotFound
from ledger.events import EVENTS, Registry
from ledger.store import EventStore, Head, RawRecord, StoredSnapshot, append_chain


class MemoryStore(EventStore):
    """Runs kept in process memory; thread-safe; nothing survives the process."""

    def __init__(self, *, registry: Registry = EVENTS, readonly: bool = False):
        self.url = "memory://"
        self.registry = registry
        self.readonly = readonly
        self._lock = threading.Condition()
        self._records: dict[str, list[RawRecord]] = {}
        self._epochs: dict[str, int] = {}
        self._snapshots: dict[str, dict[int, StoredSnapshot]] = {}

    def _run(self, run_id: str) -> list[RawRecord]:
        try:
            return self._records[run_id]
        except KeyError:
            raise RunNotFound(run_id, self.runs()) from None

    def create_run(self, run_id: str) -> None:
        self._writable(f"create run {run_id!r}")
        with self._lock:
            if run_id in self._records:
                raise RunExists(f"run {run_id!r} already exists in this ledger")
            self._records[run_id] = []
            self._epochs[run_id] = 0

    def runs(self) -> list[str]:
        return sorted(self._records)

    def acquire_epoch(self, run_id: str) -> int:
        self._writable(f"take the writer epoch of run {run_id!r}")
        with self._lock:
            self._run(run_id)
            self._epochs[run_id] += 1
            return self._epochs[run_id]

    def writer_epoch(self, run_id: str) -> int:
        with self._lock:
            self._run(run_id)
            return self._epochs[run_id]

    def head(self, run_id: str) -> Head:
        with self._lock:
            recs = self._run(run_id)
            return Head(recs[-1].seq, recs[-1].digest) if recs else Head(0, chain.GENESIS)

    def _append_encoded(self, run_id, records, expected_seq, epoch) -> Head:
        with self._lock:
            recs = self._run(run_id)
            current = self._epochs[run_id]
            if epoch != current:
                raise Fenced(run_id, epoch, current)
            head_seq = recs[-1].seq if recs else 0
            if head_seq != expected_seq:
                raise AppendConflict(run_id, expected_seq, head_seq)
            prev = recs[-1].digest if recs else chain.GENESIS
            now = time.time()
            rows = append_chain(prev, head_seq + 1, records)
            recs.extend(RawRecord(run_id, s, k, v, b, d, epoch, now) for s, k, v, b, d in rows)
            self._lock.notify_all()
            return Head(rows[-1][0], rows[-1][4])

    def scan(self, run_id: str, from_seq: int = 1, to_seq: int | None = None) -> Iterator[RawRecord]:
        with self._lock:
            recs = list(self._run(run_id))
        for r in recs:
            if r.seq >= from_seq and (to_seq is None or r.seq <= to_seq):
                yield r

    def _wait(self, run_id: str, after_seq: int, timeout: float) -> None:
        with self._lock:
            self._lock.wait_for(lambda: self.head(run_id).seq > after_seq, timeout=timeout)

    def _truncate(self, run_id: str, from_seq: int) -> int:
        self._writable(f"cut run {run_id!r}")
        with self._lock:
            recs = self._run(run_id)
            keep = [r for r in recs if r.seq < from_seq]
            self._records[run_id] = keep
            snaps = self._snapshots.get(run_id, {})
            for seq in [s for s in snaps if s >= from_seq]:
                del snaps[seq]
            return len(recs) - len(keep)

    def _put_snapshot(self, snap, keep, before_commit) -> None:
        with self._lock:
            self._run(snap.run_id)
            snaps = dict(self._snapshots.get(snap.run_id, {}))
            snaps[snap.seq] = snap
            for seq in sorted(snaps, reverse=True)[keep:]:
                del snaps[seq]
            if before_commit is not None:
                before_commit()
            self._snapshots[snap.run_id] = snaps

    def snapshots(self, run_id: str) -> list[StoredSnapshot]:
        with self._lock:
            self._run(run_id)
            snaps = self._snapshots.get(run_id, {})
            return [snaps[s] for s in sorted(snaps, reverse=True)]

    def corrupt(self, run_id: str, seq: int, body: bytes) -> None:
        """Replace one stored body (for tests of ``verify``): the chain is left as it was."""
        with self._lock:
            recs = self._run(run_id)
            for i, r in enumerate(recs):
                if r.seq == seq:
                    recs[i] = RawRecord(r.run_id, r.seq, r.kind, r.version, body, r.digest, r.epoch, r.wall_time)
                    return
            raise LedgerError(f"no seq {seq} in run {run_id!r}")

    def stats(self) -> dict:
        with self._lock:
            by_kind: collections.Counter[str] = collections.Counter()
            bytes_by_kind: collections.Counter[str] = collections.Counter()
            for recs in self._records.values():
                for r in recs:
                    by_kind[r.kind] += 1
                    bytes_by_kind[r.kind] += len(r.body)
            return {
                "url": self.url,
                "runs": {r: len(v) for r, v in sorted(self._records.items())},
                "events": sum(by_kind.values()),
                "events_by_kind": dict(sorted(by_kind.items())),
                "body_bytes": sum(bytes_by_kind.values()),
                "body_bytes_by_kind": dict(sorted(bytes_by_kind.items())),
            }
