"""Durable event stores on SQLAlchemy 2: SQLite (embedded default) and PostgreSQL.

SQLite: WAL journal, ``synchronous=FULL`` by default, a busy timeout, and explicit
``BEGIN IMMEDIATE`` for every write transaction (the stdlib driver's implicit transactions are
switched off, as SQLAlchemy's SQLite notes advise). Reads run in short deferred transactions,
so readers never block the writer and always see a committed prefix. The journal mode is set
only once the file is known to be an rlx ledger (or was just made one): opening never converts
someone else's database. Read-only stores open the file ``mode=ro`` (see ``readonly_uri``).

PostgreSQL: ``synchronous_commit=on``; read-only stores run every session with
``default_transaction_read_only=on`` and issue no DDL; appends to one run are serialised by locking the run's
row (``SELECT … FOR UPDATE``), which makes ``seq`` gapless and insert order equal commit order.
Each commit sends ``NOTIFY rlx_ledger`` with the run id; ``follow`` uses it as a wake-up only
and always re-reads from its last seq.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from ledger import chain
from ledger.errors import (
    AppendConflict,
    Busy,
    Fenced,
    LedgerError,
    RunExists,
    RunNotFound,
    StoreUnavailable,
)
from ledger.events import EVENTS, Registry
from ledger.sqlite_file import EXPECTED, check_database_file, readonly_uri, writable_uri
from ledger.store import SQLITE_SYNCHRONOUS, EventStore, Head, RawRecord, StoredSnapshot, append_chain

if TYPE_CHECKING:
    import psycopg

FORMAT = "rlx-ledger"
SCHEMA_VERSION = "1"
_CHUNK = 4096
NOTIFY_CHANNEL = "rlx_ledger"

metadata = sa.MetaData()
meta_table = sa.Table(
    "rlx_meta",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)
runs_table = sa.Table(
    "rlx_runs",
    metadata,
    sa.Column("run_id", sa.String(200), primary_key=True),
    sa.Column("writer_epoch", sa.BigInteger, nullable=False),
)
events_table = sa.Table(
    "rlx_events",
    metadata,
    sa.Column("run_id", sa.String(200), primary_key=True),
    sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("kind", sa.String(64), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("body", sa.LargeBinary, nullable=False),
    sa.Column("digest", sa.LargeBinary, nullable=False),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("wall_time", sa.Float, nullable=False),
    sqlite_with_rowid=False,
)
_ev = events_table.c
snapshots_table = sa.Table(
    "rlx_snapshots",
    metadata,
    sa.Column("run_id", sa.String(200), primary_key=True),
    sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("format", sa.Integer, nullable=False),
    sa.Column("chain_digest", sa.LargeBinary, nullable=False),
    sa.Column("body", sa.LargeBinary, nullable=False),
    sa.Column("checksum", sa.LargeBinary, nullable=False),
)
"""Optional: a ledger written before snapshots existed has no such table. A writable open adds
it (the schema version stays: the table is not needed to read the log); a read-only one sees no
snapshots."""
_sn = snapshots_table.c
_INSERT = (
    "INSERT INTO rlx_events (run_id, seq, kind, version, body, digest, epoch, wall_time) "
    "VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p})"
)


_COLUMNS = _INSERT.count("{p}")
_MAX_INSERT_ROWS = 64
"""Rows per multi-row INSERT on SQLite (8 columns: 512 parameters, under every SQLite's limit)."""


@functools.cache
def _insert_rows_sql(n: int) -> str:
    """``INSERT … VALUES (…), (…) …`` for ``n`` rows (``?`` placeholders)."""
    head, values = _INSERT.split("VALUES ")
    return head + "VALUES " + ", ".join([values.format(p="?")] * n)


@functools.cache
def _linked_sql(kinds: int | None) -> str:
    """The SQLite statement of ``scan_linked`` for ``kinds`` kinds (None: every kind)."""
    where = "" if kinds is None else f" AND e.kind IN ({', '.join('?' * kinds)})"
    return ("SELECT e.seq, e.kind, e.version, e.body, e.digest, e.epoch, e.wall_time, p.digest "
            "FROM rlx_events e LEFT JOIN rlx_events p ON p.run_id = e.run_id AND p.seq = e.seq - 1 "
            f"WHERE e.run_id = ? AND e.seq >= ? AND e.seq <= ?{where} ORDER BY e.seq LIMIT ?")


def _check_head(run_id: str, expected_seq: int, epoch: int, current_epoch: int, head: Head) -> None:
    """Inside a write transaction: the writer holds the current epoch and the head is expected."""
    if epoch != current_epoch:
        raise Fenced(run_id, epoch, current_epoch)
    if head.seq != expected_seq:
        raise AppendConflict(run_id, expected_seq, head.seq)


def _rows(run_id: str, records, expected_seq: int, epoch: int, current_epoch: int, head: Head) -> list[tuple]:
    """Inside a write transaction: check the fence and the head, then the chained rows to insert."""
    _check_head(run_id, expected_seq, epoch, current_epoch, head)
    now = time.time()
    return [(run_id, s, k, v, b, d, epoch, now) for s, k, v, b, d in append_chain(head.digest, head.seq + 1, records)]


class _SqlStore(EventStore):
    """Shared SQLAlchemy logic; subclasses configure the engine and the run lock."""

    _paramstyle = "?"

    def __init__(self, url: str, engine: sa.Engine, read_engine: sa.Engine, *, create: bool, readonly: bool,
                 registry: Registry):
        self.url = sa.engine.make_url(url).render_as_string(hide_password=True)  # shown, never the secret
        self.registry = registry
        self.readonly = readonly
        self._engine = engine
        self._read_engine = read_engine
        self._insert_sql = _INSERT.format(p=self._paramstyle)
        with self._translate("open"):
            self._ensure_schema(create)

    # -- plumbing ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _translate(self, what: str):
        try:
            yield
        except LedgerError:
            raise
        except sa_exc.OperationalError as e:
            msg = " ".join((str(e.orig) if e.orig is not None else str(e)).split())  # one line
            if "locked" in msg or "busy" in msg:
                raise Busy(f"ledger {self._display()} busy during {what}: {msg}") from e
            raise StoreUnavailable(f"ledger {self._display()} failed during {what}: {msg}") from e
        except sa_exc.DBAPIError as e:
            msg = " ".join((str(e.orig) if e.orig is not None else str(e)).split())
            raise LedgerError(f"ledger {self._display()} failed during {what}: {msg}") from e

    def _display(self) -> str:
        return self.url

    def _where(self) -> str:
        """The ledger as errors name it."""
        return self._display()

    def _ensure_schema(self, create: bool) -> None:
        """Check that the database is an rlx ledger of this schema; with ``create``, make an empty
        one a ledger. Only reads unless it creates."""
        with self._read_engine.connect() as conn:
            names = set(sa.inspect(conn).get_table_names())
            rows = dict(conn.execute(sa.select(meta_table.c.key, meta_table.c.value)).all()) if "rlx_meta" in names else None
        self._has_snapshots = "rlx_snapshots" in names
        if rows is not None:
            if rows.get("format") != FORMAT:
                raise StoreUnavailable(f"{self._where()} is not an rlx ledger: its rlx_meta table says format "
                                       f"{rows.get('format')!r}; {EXPECTED}")
            if rows.get("schema_version") != SCHEMA_VERSION:
                raise StoreUnavailable(
                    f"{self._where()} has ledger schema {rows.get('schema_version')!r}; "
                    f"this software reads schema {SCHEMA_VERSION!r}"
                )
            if not self._has_snapshots and not self.readonly:
                self._add_snapshots_table()
            return
        if not create:
            raise StoreUnavailable(f"{self._where()} is not an rlx ledger: it has no rlx_meta table; {EXPECTED}")
        if names - {"rlx_runs", "rlx_events", "rlx_snapshots"} and not self._allow_foreign_tables():
            raise StoreUnavailable(
                f"{self._where()} is a database with other tables ({', '.join(sorted(names)[:5])}), "
                "not an rlx ledger; refusing to write into it"
            )
        try:
            with self._engine.begin() as conn:
                metadata.create_all(conn)
                conn.execute(
                    meta_table.insert(),
                    [{"key": "format", "value": FORMAT}, {"key": "schema_version", "value": SCHEMA_VERSION}],
                )
        except sa_exc.IntegrityError:
            pass  # another process created the schema at the same moment
        self._has_snapshots = True

    def _add_snapshots_table(self) -> None:
        """Give a ledger written before snapshots existed its (empty) snapshot table."""
        try:
            with self._engine.begin() as conn:
                snapshots_table.create(conn, checkfirst=True)
        except sa_exc.DBAPIError:
            with self._read_engine.connect() as conn:  # created by another process at the same moment?
                if "rlx_snapshots" not in sa.inspect(conn).get_table_names():
                    raise
        self._has_snapshots = True

    def _allow_foreign_tables(self) -> bool:
        return False

    def _lock_run(self, conn: sa.Connection, run_id: str) -> int:
        """Inside a write transaction: lock the run and return its writer epoch."""
        row = conn.execute(
            sa.select(runs_table.c.writer_epoch).where(runs_table.c.run_id == run_id)
        ).first()
        if row is None:
            raise RunNotFound(run_id, self.runs())
        return int(row[0])

    def _after_append(self, conn: sa.Connection, run_id: str) -> None:
        """Inside the append transaction, after the insert (PostgreSQL notifies)."""

    # -- primitives ----------------------------------------------------------------------------

    def create_run(self, run_id: str) -> None:
        if not isinstance(run_id, str) or not run_id or len(run_id) > 200:
            raise LedgerError(f"invalid run id {run_id!r}: a non-empty string of at most 200 characters")
        self._writable(f"create run {run_id!r}")
        with self._translate("create_run"):
            try:
                with self._engine.begin() as conn:
                    conn.execute(runs_table.insert().values(run_id=run_id, writer_epoch=0))
            except sa_exc.IntegrityError:
                raise RunExists(f"run {run_id!r} already exists in this ledger") from None

    def runs(self) -> list[str]:
        with self._translate("runs"), self._read_engine.connect() as conn:
            return [r[0] for r in conn.execute(sa.select(runs_table.c.run_id).order_by(runs_table.c.run_id))]

    def acquire_epoch(self, run_id: str) -> int:
        self._writable(f"take the writer epoch of run {run_id!r}")
        with self._translate("acquire_epoch"), self._engine.begin() as conn:
            epoch = self._lock_run(conn, run_id) + 1
            conn.execute(
                runs_table.update().where(runs_table.c.run_id == run_id).values(writer_epoch=epoch)
            )
            return epoch

    def writer_epoch(self, run_id: str) -> int:
        with self._translate("writer_epoch"), self._read_engine.connect() as conn:
            row = conn.execute(
                sa.select(runs_table.c.writer_epoch).where(runs_table.c.run_id == run_id)
            ).first()
        if row is None:
            raise RunNotFound(run_id, self.runs())
        return int(row[0])

    @staticmethod
    def _head_in(conn: sa.Connection, run_id: str) -> Head:
        row = conn.execute(
            sa.select(_ev.seq, _ev.digest).where(_ev.run_id == run_id).order_by(_ev.seq.desc()).limit(1)
        ).first()
        return Head(int(row[0]), bytes(row[1])) if row else Head(0, chain.GENESIS)

    def head(self, run_id: str) -> Head:
        with self._translate("head"), self._read_engine.connect() as conn:
            head = self._head_in(conn, run_id)
            if head.seq == 0 and run_id not in self.runs():
                raise RunNotFound(run_id, self.runs())
            return head

    def _append_encoded(self, run_id, records, expected_seq, epoch) -> Head:
        with self._translate("append"), self._engine.begin() as conn:
            current = self._lock_run(conn, run_id)
            rows = _rows(run_id, records, expected_seq, epoch, current, self._head_in(conn, run_id))
            conn.exec_driver_sql(self._insert_sql, rows)
            self._after_append(conn, run_id)
            return Head(rows[-1][1], rows[-1][5])

    def _chunk(self, run_id: str, from_seq: int, to_seq: int | None, limit: int) -> Sequence[Any]:
        q = sa.select(_ev.seq, _ev.kind, _ev.version, _ev.body, _ev.digest, _ev.epoch, _ev.wall_time).where(
            _ev.run_id == run_id, _ev.seq >= from_seq
        )
        if to_seq is not None:
            q = q.where(_ev.seq <= to_seq)
        with self._read_engine.connect() as conn:
            return conn.execute(q.order_by(_ev.seq).limit(limit)).all()

    def scan(self, run_id: str, from_seq: int = 1, to_seq: int | None = None) -> Iterator[RawRecord]:
        if run_id not in self.runs():
            raise RunNotFound(run_id, self.runs())
        seq = from_seq
        while True:
            try:
                rows = self._chunk(run_id, seq, to_seq, _CHUNK)
            except sa_exc.DBAPIError:
                # A damaged page somewhere in this chunk: read one record at a time to hand out
                # every readable record before the first unreadable one.
                with self._translate(f"read at seq {seq}"):
                    rows = self._chunk(run_id, seq, to_seq, 1)
            for row in rows:  # both drivers return int, str, bytes and float as declared
                yield RawRecord(run_id, *row)
            if len(rows) < _CHUNK and len(rows) != 1:
                return
            if not rows:
                return
            seq = int(rows[-1][0]) + 1

    def scan_linked(self, run_id: str, kinds: Iterable[str] | None = None, from_seq: int = 1,
                    to_seq: int | None = None) -> Iterator[tuple[bytes | None, RawRecord]]:
        """The records of ``kinds`` selected by the database (the others are never fetched), each
        joined with the digest stored at the seq before it."""
        if run_id not in self.runs():
            raise RunNotFound(run_id, self.runs())
        names = None if kinds is None else tuple(sorted(set(kinds)))
        upper = (1 << 63) - 1 if to_seq is None else to_seq
        seq = from_seq
        while True:
            with self._translate(f"read from seq {seq}"):
                rows = self._linked_chunk(run_id, names, seq, upper, _CHUNK)
            for row in rows:
                r = RawRecord(run_id, *row[:7])
                prev = row[7]
                yield (chain.GENESIS if r.seq == 1 else None if prev is None else bytes(prev)), r
            if len(rows) < _CHUNK:
                return
            seq = int(rows[-1][0]) + 1

    def _linked_chunk(self, run_id: str, kinds: tuple[str, ...] | None, from_seq: int, to_seq: int,
                      limit: int) -> Sequence[Any]:
        """Up to ``limit`` rows ``(seq, kind, version, body, digest, epoch, wall_time, digest before)``."""
        before = events_table.alias("before")
        q = (sa.select(_ev.seq, _ev.kind, _ev.version, _ev.body, _ev.digest, _ev.epoch, _ev.wall_time,
                       before.c.digest)
             .select_from(events_table.outerjoin(before, sa.and_(before.c.run_id == _ev.run_id,
                                                                 before.c.seq == _ev.seq - 1)))
             .where(_ev.run_id == run_id, _ev.seq >= from_seq, _ev.seq <= to_seq))
        if kinds is not None:
            q = q.where(_ev.kind.in_(kinds))
        with self._read_engine.connect() as conn:
            return [(int(a), k, int(v), bytes(b), bytes(d), int(e), float(w), p)
                    for a, k, v, b, d, e, w, p in conn.execute(q.order_by(_ev.seq).limit(limit)).all()]

    def count(self, run_id: str) -> int:
        with self._translate("count"), self._read_engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(events_table)
                                    .where(_ev.run_id == run_id)).scalar_one())

    def _truncate(self, run_id: str, from_seq: int) -> int:
        self._writable(f"cut run {run_id!r}")
        with self._translate("repair"), self._engine.begin() as conn:
            self._lock_run(conn, run_id)
            res = conn.execute(events_table.delete().where(_ev.run_id == run_id, _ev.seq >= from_seq))
            if self._has_snapshots:
                conn.execute(snapshots_table.delete().where(_sn.run_id == run_id, _sn.seq >= from_seq))
            return int(res.rowcount)

    def _put_snapshot(self, snap: StoredSnapshot, keep: int, before_commit) -> None:
        with self._translate("snapshot"), self._engine.begin() as conn:
            self._lock_run(conn, snap.run_id)
            conn.execute(snapshots_table.delete().where(_sn.run_id == snap.run_id, _sn.seq == snap.seq))
            conn.execute(snapshots_table.insert().values(
                run_id=snap.run_id, seq=snap.seq, format=snap.format, chain_digest=snap.chain_digest,
                body=snap.body, checksum=snap.checksum))
            seqs = conn.execute(sa.select(_sn.seq).where(_sn.run_id == snap.run_id).order_by(_sn.seq.desc())).scalars()
            old = [int(s) for s in seqs][keep:]
            if old:
                conn.execute(snapshots_table.delete().where(_sn.run_id == snap.run_id, _sn.seq.in_(old)))
            if before_commit is not None:
                before_commit()

    def snapshots(self, run_id: str) -> list[StoredSnapshot]:
        if run_id not in self.runs():
            raise RunNotFound(run_id, self.runs())
        if not self._has_snapshots:
            return []
        with self._translate("snapshots"), self._read_engine.connect() as conn:
            rows = conn.execute(
                sa.select(_sn.seq, _sn.format, _sn.chain_digest, _sn.body, _sn.checksum)
                .where(_sn.run_id == run_id).order_by(_sn.seq.desc())
            ).all()
        return [StoredSnapshot(run_id, int(q), int(f), bytes(d), bytes(b), bytes(c)) for q, f, d, b, c in rows]

    def stats(self) -> dict:
        with self._translate("stats"), self._read_engine.connect() as conn:
            by_kind = conn.execute(
                sa.select(_ev.kind, sa.func.count(), sa.func.sum(sa.func.length(_ev.body)))
                .group_by(_ev.kind)
                .order_by(_ev.kind)
            ).all()
            per_run: dict[str, int] = dict(
                conn.execute(sa.select(_ev.run_id, sa.func.count()).group_by(_ev.run_id)).all()
            )
        runs = {r: int(per_run.get(r, 0)) for r in self.runs()}
        return {
            "url": self._display(),
            "runs": runs,
            "events": sum(int(c) for _, c, _ in by_kind),
            "events_by_kind": {k: int(c) for k, c, _ in by_kind},
            "body_bytes": sum(int(b or 0) for _, _, b in by_kind),
            "body_bytes_by_kind": {k: int(b or 0) for k, _, b in by_kind},
            **self._size(),
        }

    def _size(self) -> dict:
        return {}

    def close(self) -> None:
        self._engine.dispose()
        self._read_engine.dispose()


def _insert(conn, run_id: str, records, epoch: int, head: Head) -> Head:
    """Chain ``records`` after ``head`` and insert them in a few multi-row statements sized by
    powers of two (a handful of cached statement shapes); return the new head.

    ``executemany`` steps once per row, and the sqlite3 module releases the GIL around every
    step: beside busy threads each release can cost a thread switch.
    """
    now = time.time()
    flat: list = []
    for seq, kind, version, body, digest in append_chain(head.digest, head.seq + 1, records):
        flat += (run_id, seq, kind, version, body, digest, epoch, now)
    i, n = 0, len(records)
    while i < n:
        k = min(_MAX_INSERT_ROWS, 1 << ((n - i).bit_length() - 1))
        conn.execute(_insert_rows_sql(k), flat[i * _COLUMNS : (i + k) * _COLUMNS])
        i += k
    return Head(seq, digest)


class SqliteStore(_SqlStore):
    """The embedded default: one SQLite file."""

    def __init__(
        self,
        url: str,
        *,
        create: bool = False,
        readonly: bool = False,
        registry: Registry = EVENTS,
        synchronous: str = "FULL",
        busy_timeout_ms: int = 30_000,
    ):
        if synchronous.upper() not in SQLITE_SYNCHRONOUS:
            raise LedgerError(f"invalid synchronous={synchronous!r}; accepted: {', '.join(SQLITE_SYNCHRONOUS)}")
        if create and readonly:
            raise LedgerError("a ledger cannot be opened both to create it and read-only")
        path = sa.engine.make_url(url).database
        if not path:
            raise StoreUnavailable(f"SQLite URL {url!r} names no file; use sqlite:///PATH")
        self.path = os.path.abspath(path)
        if os.path.isdir(self.path):
            raise StoreUnavailable(f"{self.path} is a directory, not a ledger file")
        if not create and not os.path.exists(self.path):
            raise StoreUnavailable(f"no ledger at {self.path} (file does not exist)")
        if create and not os.path.isdir(os.path.dirname(self.path)):
            raise StoreUnavailable(f"cannot create ledger {self.path}: directory {os.path.dirname(self.path)} does not exist")
        if not create:
            check_database_file(self.path)
        creator_url = readonly_uri(self.path) if readonly else writable_uri(self.path, create=create)
        self._sync = synchronous.upper()
        self._busy = int(busy_timeout_ms)
        self._readonly = readonly
        self._creator_url = creator_url
        self._writer = None  # the appends' own connection, opened on the first append
        self._writer_lock = threading.Lock()
        read_engine = self._make_engine(creator_url, "BEGIN")
        engine = read_engine if readonly else self._make_engine(creator_url, "BEGIN IMMEDIATE")
        try:
            super().__init__("sqlite:///" + self.path, engine, read_engine, create=create, readonly=readonly,
                             registry=registry)
            if not readonly:
                self._use_wal()
        except LedgerError as e:
            engine.dispose()
            read_engine.dispose()
            if "file is not a database" in str(e):
                raise StoreUnavailable(f"{self.path} is not an rlx ledger: it is not a SQLite database; {EXPECTED}") from None
            raise

    def _where(self) -> str:
        return self.path

    def _use_wal(self) -> None:
        """Switch the ledger, known by now to be one, to WAL (a no-op once it is: the mode is
        kept in the file); connections opened before the switch are dropped."""
        import sqlite3

        try:
            conn = self._connect(self._creator_url)
            try:
                (mode,) = conn.execute("PRAGMA journal_mode=WAL").fetchone()
            finally:
                conn.close()
        except sqlite3.Error as e:
            raise StoreUnavailable(f"ledger {self.path} cannot use a write-ahead log: {e}") from e
        if str(mode).lower() != "wal":
            raise StoreUnavailable(f"ledger {self.path} cannot use a write-ahead log (journal mode stays {mode!r})")
        self._engine.dispose()
        self._read_engine.dispose()

    def close(self) -> None:
        with self._writer_lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        super().close()

    def _connect(self, creator_url: str):
        import sqlite3

        conn = sqlite3.connect(creator_url, uri=True, check_same_thread=False, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout={self._busy}")
        if self._readonly:
            conn.execute("PRAGMA query_only=ON")
        else:
            conn.execute(f"PRAGMA synchronous={self._sync}")
        return conn

    def _make_engine(self, creator_url: str, begin: str) -> sa.Engine:
        engine = sa.create_engine("sqlite://", creator=lambda: self._connect(creator_url),
                                  poolclass=sa.pool.QueuePool, pool_size=4)

        @sa.event.listens_for(engine, "begin")
        def _begin(conn: sa.Connection) -> None:
            conn.exec_driver_sql(begin)

        return engine

    _HEAD_SQL = (
        "SELECT r.writer_epoch, e.seq, e.digest FROM rlx_runs r LEFT JOIN rlx_events e "
        "ON e.run_id = r.run_id AND e.seq = (SELECT MAX(seq) FROM rlx_events WHERE run_id = r.run_id) "
        "WHERE r.run_id = ?"
    )

    def _append_encoded(self, run_id, records, expected_seq, epoch) -> Head:
        """The hot path on the stdlib driver itself (same checks as the portable one).

        One ``BEGIN IMMEDIATE``, one query for the writer epoch and the head, a few multi-row
        ``INSERT``s, one ``COMMIT``, on a connection kept for appends: going through
        SQLAlchemy's pool and execution layer would cost more than small batches themselves.
        """
        import sqlite3

        with self._translate("append"), self._writer_lock:
            conn = self._writer
            if conn is None:
                conn = self._writer = self._connect(self._creator_url)
            try:
                conn.execute("BEGIN IMMEDIATE")
                row = conn.execute(self._HEAD_SQL, (run_id,)).fetchone()
                if row is None:
                    raise RunNotFound(run_id, self.runs())
                current, head_seq, head_digest = row
                head = Head(head_seq, head_digest) if head_seq is not None else Head(0, chain.GENESIS)
                _check_head(run_id, expected_seq, epoch, current, head)
                new_head = _insert(conn, run_id, records, epoch, head)
                conn.execute("COMMIT")
            except BaseException as e:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(e, sqlite3.OperationalError) and ("locked" in str(e) or "busy" in str(e)):
                    raise Busy(f"ledger {self._display()} busy during append: {e}") from e
                if isinstance(e, sqlite3.Error):
                    raise LedgerError(f"ledger {self._display()} failed during append: {e}") from e
                raise
            return new_head

    _CHUNK_SQL = (
        "SELECT seq, kind, version, body, digest, epoch, wall_time FROM rlx_events "
        "WHERE run_id = ? AND seq >= ? AND seq <= ? ORDER BY seq LIMIT ?"
    )

    def _chunk(self, run_id: str, from_seq: int, to_seq: int | None, limit: int) -> Sequence[Any]:
        """Records straight from the stdlib cursor (plain tuples): reading a long log is the
        replay's hot path. One statement is one consistent read in autocommit mode."""
        import sqlite3

        upper = (1 << 63) - 1 if to_seq is None else to_seq
        with self._read_engine.connect() as sa_conn:
            dbapi = sa_conn.connection.dbapi_connection
            assert dbapi is not None  # an open connection has its driver connection
            try:
                return dbapi.execute(
                    self._CHUNK_SQL, (run_id, from_seq, upper, limit)
                ).fetchall()
            except sqlite3.DatabaseError as e:
                raise sa_exc.DBAPIError(self._CHUNK_SQL, None, e) from e

    def _linked_chunk(self, run_id: str, kinds: tuple[str, ...] | None, from_seq: int, to_seq: int,
                      limit: int) -> Sequence[Any]:
        """The same rows straight from the stdlib cursor, as :meth:`_chunk` reads them."""
        import sqlite3

        sql = _linked_sql(None if kinds is None else len(kinds))
        with self._read_engine.connect() as sa_conn:
            dbapi = sa_conn.connection.dbapi_connection
            assert dbapi is not None  # an open connection has its driver connection
            try:
                return dbapi.execute(sql, (run_id, from_seq, to_seq, *(kinds or ()), limit)).fetchall()
            except sqlite3.DatabaseError as e:
                raise sa_exc.DBAPIError(sql, None, e) from e

    def _size(self) -> dict:
        total = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(OSError):
                total += os.path.getsize(self.path + suffix)
        return {"file_bytes": total}


class PostgresStore(_SqlStore):
    """PostgreSQL through psycopg 3, for many writers' hosts and long-lived runs."""

    _paramstyle = "%s"

    def __init__(self, url: str, *, create: bool = False, readonly: bool = False, registry: Registry = EVENTS):
        if create and readonly:
            raise LedgerError("a ledger cannot be opened both to create it and read-only")
        u = sa.engine.make_url(url)
        if u.drivername in ("postgresql", "postgres"):
            u = u.set(drivername="postgresql+psycopg")
        # Durability is not left to the server's default: every session commits synchronously.
        # A read-only store's sessions refuse every write on the server's side too.
        options = u.query.get("options", "")
        if not isinstance(options, str):  # ?options= given more than once
            raise LedgerError(f"the ledger URL gives options {len(options)} times; give them once")
        options += " -c synchronous_commit=on"
        if readonly:
            options += " -c default_transaction_read_only=on"
        options = options.strip()
        u = u.update_query_dict({"options": options})
        self._conninfo = u.set(drivername="postgresql").render_as_string(hide_password=False)
        engine = sa.create_engine(u, pool_pre_ping=True)
        self._listener: psycopg.Connection | None = None
        try:
            super().__init__(url, engine, engine, create=create,
                             readonly=readonly, registry=registry)
        except LedgerError:
            engine.dispose()
            raise

    def _allow_foreign_tables(self) -> bool:
        return True  # a PostgreSQL database is shared with other applications' tables

    def _lock_run(self, conn: sa.Connection, run_id: str) -> int:
        row = conn.execute(
            sa.select(runs_table.c.writer_epoch).where(runs_table.c.run_id == run_id).with_for_update()
        ).first()
        if row is None:
            raise RunNotFound(run_id, self.runs())
        return int(row[0])

    def _after_append(self, conn: sa.Connection, run_id: str) -> None:
        conn.execute(sa.select(sa.func.pg_notify(NOTIFY_CHANNEL, run_id)))

    def _wait(self, run_id: str, after_seq: int, timeout: float) -> None:
        import psycopg

        if self._listener is None:
            self._listener = psycopg.connect(self._conninfo, autocommit=True)
            self._listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        for n in self._listener.notifies(timeout=timeout, stop_after=1):
            if n.payload == run_id:
                return

    def _size(self) -> dict:
        with self._read_engine.connect() as conn:
            n = conn.execute(sa.text("SELECT pg_total_relation_size('rlx_events')")).scalar()
        return {"table_bytes": int(n or 0)}

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        super().close()
