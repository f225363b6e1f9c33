"""One contract for every event store, run against memory, a SQLite file and real PostgreSQL."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import sqlalchemy as sa

from ledger import (
    AppendConflict,
    CodecError,
    CorruptLedger,
    Fenced,
    LedgerError,
    MemoryStore,
    RolloutAssigned,
    RolloutCompleted,
    RunExists,
    RunNotFound,
    WorkerJoined,
    chain,
    open_store,
)


def assigned(n: int, start: int = 0, worker: str = "w") -> list[RolloutAssigned]:
    return [RolloutAssigned(worker, (start + i,), (0,)) for i in range(n)]


class StoreContract:
    """Subclasses provide ``make_store`` (a fresh, empty store) and ``damage_body``."""

    def make_store(self):
        raise NotImplementedError

    def damage_body(self, store, run_id: str, seq: int, body: bytes) -> None:
        raise NotImplementedError

    @pytest.fixture
    def store(self):
        s = self.make_store()
        yield s
        s.close()

    @pytest.fixture
    def run(self, store):
        store.create_run("run-a")
        return "run-a", store.acquire_epoch("run-a")

    # -- runs and epochs -----------------------------------------------------------------------

    def test_runs_are_created_once_and_listed(self, store):
        store.create_run("b")
        store.create_run("a")
        assert store.runs() == ["a", "b"]
        with pytest.raises(RunExists):
            store.create_run("a")

    def test_unknown_run_is_named(self, store):
        store.create_run("known")
        with pytest.raises(RunNotFound, match="no run 'nope'.*'known'"):
            list(store.read("nope"))
        with pytest.raises(RunNotFound):
            store.append("nope", assigned(1), expected_seq=0, epoch=1)

    def test_epochs_increase(self, store):
        store.create_run("r")
        assert store.writer_epoch("r") == 0
        assert [store.acquire_epoch("r") for _ in range(3)] == [1, 2, 3]
        assert store.writer_epoch("r") == 3

    # -- append and read -------------------------------------------------------------------------

    def test_round_trip_with_gapless_seqs_and_chain(self, store, run):
        run_id, epoch = run
        tokens = np.array([5, 6, 7], dtype=np.int32)
        logps = np.array([-0.5, -1.25, np.nan], dtype=np.float32)
        evs = [WorkerJoined("w", "inference"), RolloutCompleted(0, "w", 0, 0, "d", tokens, logps, "stop")]
        head = store.append(run_id, evs, expected_seq=0, epoch=epoch)
        head = store.append(run_id, assigned(3), expected_seq=head.seq, epoch=epoch)
        stored = list(store.read(run_id))
        assert [s.seq for s in stored] == [1, 2, 3, 4, 5]
        assert [s.event for s in stored] == evs + assigned(3)
        got = stored[1].event
        assert got.logprobs.tobytes() == logps.tobytes() and got.tokens.dtype == np.int32
        prev = chain.GENESIS
        for r in store.scan(run_id):
            prev = chain.link(prev, r.kind, r.version, r.body)
            assert prev == r.digest
        assert store.head(run_id) == head and head.seq == 5 and head.digest == prev
        assert [s.seq for s in store.read(run_id, 3, 4)] == [3, 4]
        assert all(s.epoch == epoch for s in stored)

    def test_conflicting_append_writes_nothing(self, store, run):
        run_id, epoch = run
        store.append(run_id, assigned(2), expected_seq=0, epoch=epoch)
        for wrong in (0, 1, 3):
            with pytest.raises(AppendConflict) as info:
                store.append(run_id, assigned(5, 100), expected_seq=wrong, epoch=epoch)
            assert info.value.actual_seq == 2
        assert [s.event for s in store.read(run_id)] == assigned(2)

    def test_unencodable_batch_writes_nothing(self, store, run):
        run_id, epoch = run
        bad = RolloutAssigned(object(), (1,), (0,))  # type: ignore[arg-type]
        with pytest.raises(CodecError):
            store.append(run_id, assigned(3) + [bad], expected_seq=0, epoch=epoch)
        assert store.head(run_id).seq == 0
        with pytest.raises(LedgerError):
            store.append(run_id, [], expected_seq=0, epoch=epoch)

    def test_stale_epoch_is_fenced_and_writes_nothing(self, store, run):
        run_id, old = run
        store.append(run_id, assigned(1), expected_seq=0, epoch=old)
        new = store.acquire_epoch(run_id)
        with pytest.raises(Fenced) as info:
            store.append(run_id, assigned(1, 10), expected_seq=1, epoch=old)
        assert (info.value.epoch, info.value.current_epoch) == (old, new)
        assert store.head(run_id).seq == 1
        store.append(run_id, assigned(1, 20), expected_seq=1, epoch=new)
        assert [s.epoch for s in store.read(run_id)] == [old, new]

    def test_runs_are_independent(self, store):
        for r in ("x", "y"):
            store.create_run(r)
        ex, ey = store.acquire_epoch("x"), store.acquire_epoch("y")
        store.append("x", assigned(3), expected_seq=0, epoch=ex)
        store.append("y", assigned(1, 50), expected_seq=0, epoch=ey)
        assert store.head("x").seq == 3 and store.head("y").seq == 1
        assert [s.event.rollout_ids for s in store.read("y")] == [(50,)]
        stats = store.stats()
        assert stats["runs"] == {"x": 3, "y": 1}
        assert stats["events_by_kind"] == {"RolloutAssigned": 4}

    # -- concurrency -------------------------------------------------------------------------------

    def test_racing_writers_never_interleave_and_readers_see_whole_batches(self, store, run):
        run_id, epoch = run
        writers, batches, size = 4, 8, 5
        stop = threading.Event()
        errors: list[BaseException] = []

        def write(w: int) -> None:
            try:
                for b in range(batches):
                    evs = [RolloutAssigned(f"w{w}", (b * size + i,), (b,)) for i in range(size)]
                    while True:
                        head = store.head(run_id).seq
                        try:
                            store.append(run_id, evs, expected_seq=head, epoch=epoch)
                            break
                        except AppendConflict:
                            continue
            except BaseException as e:  # surfaced below
                errors.append(e)

        def read() -> None:
            try:
                while not stop.is_set():
                    seen = list(store.read(run_id))
                    assert len(seen) % size == 0, f"reader saw a partial batch: {len(seen)} events"
                    assert [s.seq for s in seen] == list(range(1, len(seen) + 1))
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
        reader = threading.Thread(target=read)
        reader.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        reader.join()
        assert not errors, errors[0]
        evs = [s.event for s in store.read(run_id)]
        assert len(evs) == writers * batches * size
        for i in range(0, len(evs), size):
            chunk = evs[i : i + size]
            assert len({e.worker_id for e in chunk}) == 1 and len({e.attempts for e in chunk}) == 1
            assert [e.rollout_ids[0] % size for e in chunk] == list(range(size))
        assert store.verify(run_id).ok

    def test_follow_yields_every_event_in_order_while_a_writer_appends(self, store, run):
        run_id, epoch = run
        total = 60

        def write() -> None:
            head = 0
            for b in range(0, total, 6):
                head = store.append(run_id, assigned(6, b), expected_seq=head, epoch=epoch).seq

        t = threading.Thread(target=write)
        t.start()
        got = []
        for s in store.follow(run_id, poll_interval=0.01, idle_timeout=5.0):
            got.append(s.seq)
            if len(got) == total:
                break
        t.join()
        assert got == list(range(1, total + 1))

    def test_scan_linked_selects_kinds_and_ranges_with_the_digest_before_each(self, store, run):
        run_id, epoch = run
        evs = [WorkerJoined(f"w{i}", "inference") if i % 3 == 0 else assigned(1, i)[0] for i in range(12)]
        store.append(run_id, evs, expected_seq=0, epoch=epoch)
        store.create_run("other")
        store.append("other", assigned(4), expected_seq=0, epoch=store.acquire_epoch("other"))
        digests = {r.seq: r.digest for r in store.scan(run_id)} | {0: chain.GENESIS}
        got = list(store.scan_linked(run_id, ["WorkerJoined"]))
        assert [r.seq for _, r in got] == [1, 4, 7, 10]  # events 0, 3, 6, 9
        assert all(prev == digests[r.seq - 1] and chain.link(prev, r.kind, r.version, r.body) == r.digest
                   for prev, r in got)
        ranged = list(store.scan_linked(run_id, ["RolloutAssigned", "WorkerJoined"], 5, 8))
        assert [(r.seq, r.kind, prev) for prev, r in ranged] == [
            (s, "WorkerJoined" if s % 3 == 1 else "RolloutAssigned", digests[s - 1]) for s in range(5, 9)]
        assert [r.seq for _, r in store.scan_linked(run_id)] == list(range(1, 13))
        assert (store.count(run_id), store.count("other")) == (12, 4)
        with pytest.raises(RunNotFound):
            list(store.scan_linked("nope"))

    # -- verification and repair -------------------------------------------------------------------

    def test_intact_run_verifies(self, store, run):
        run_id, epoch = run
        head = store.append(run_id, assigned(10), expected_seq=0, epoch=epoch)
        report = store.verify(run_id)
        assert report.ok and report.events == 10 and report.head_seq == 10
        assert report.head_digest == head.digest.hex()
        assert store.repair(run_id).removed == 0

    def test_flipped_byte_in_the_middle_is_named_and_not_repaired_without_force(self, store, run):
        run_id, epoch = run
        store.append(run_id, assigned(10), expected_seq=0, epoch=epoch)
        body = bytearray(next(store.scan(run_id, 4, 4)).body)
        body[-1] ^= 0x01
        self.damage_body(store, run_id, 4, bytes(body))
        report = store.verify(run_id)
        assert not report.ok and report.first_bad_seq == 4 and not report.torn_tail
        assert "digest mismatch" in report.reason
        with pytest.raises(CorruptLedger, match="seq 4.*refusing"):
            store.repair(run_id)
        assert store.head(run_id).seq == 10  # refused: nothing removed
        fixed = store.repair(run_id, force=True)
        assert (fixed.truncated_from, fixed.removed, fixed.head_seq) == (4, 7, 3)
        assert store.verify(run_id).ok

    def test_torn_tail_is_cut_back_to_the_last_valid_event(self, store, run):
        run_id, epoch = run
        store.append(run_id, assigned(8), expected_seq=0, epoch=epoch)
        for seq in (7, 8):
            body = next(store.scan(run_id, seq, seq)).body
            self.damage_body(store, run_id, seq, body[: len(body) // 2])  # a half-written record
        report = store.verify(run_id)
        assert not report.ok and report.first_bad_seq == 7 and report.torn_tail
        assert report.bad_seqs == (7, 8)
        repaired = store.repair(run_id)
        assert (repaired.truncated_from, repaired.removed) == (7, 2)
        assert store.verify(run_id).ok and store.head(run_id).seq == 6
        epoch2 = store.acquire_epoch(run_id)
        store.append(run_id, assigned(1, 99), expected_seq=6, epoch=epoch2)  # the run goes on
        assert store.verify(run_id).ok


class TestMemoryStore(StoreContract):
    def make_store(self):
        return MemoryStore()

    def damage_body(self, store, run_id, seq, body):
        store.corrupt(run_id, seq, body)


class _SqlDamage:
    def damage_body(self, store, run_id, seq, body):
        from ledger.sql import events_table as t

        with store._engine.begin() as conn:
            conn.execute(t.update().where(t.c.run_id == run_id, t.c.seq == seq).values(body=body))


class TestSqliteStore(_SqlDamage, StoreContract):
    @pytest.fixture(autouse=True)
    def _dir(self, tmp_path):
        self.path = tmp_path / "ledger.db"

    def make_store(self):
        return open_store(self.path, create=True)

    def test_pragmas_are_wal_full_with_busy_timeout(self, store):
        with store._engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000

    def test_reopen_sees_everything(self, store, run):
        run_id, epoch = run
        store.append(run_id, assigned(4), expected_seq=0, epoch=epoch)
        store.close()
        with open_store(self.path) as again:
            assert again.head(run_id).seq == 4 and again.writer_epoch(run_id) == epoch


@pytest.mark.postgres
class TestPostgresStore(_SqlDamage, StoreContract):
    @pytest.fixture(autouse=True)
    def _url(self, pg_url):
        self.url = pg_url

    def make_store(self):
        return open_store(self.url, create=True)

    def test_commits_are_synchronous(self, store):
        with store._engine.connect() as conn:
            assert conn.execute(sa.text("SHOW synchronous_commit")).scalar() == "on"


def test_bad_targets_name_the_problem_and_create_nothing(tmp_path):
    from ledger import StoreUnavailable

    missing = tmp_path / "nope" / "ledger.db"
    with pytest.raises(StoreUnavailable, match="does not exist"):
        open_store(missing)
    with pytest.raises(StoreUnavailable, match="unsupported ledger URL scheme 'ftp'"):
        open_store("ftp://host/x")
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreUnavailable, match="not an rlx ledger"):
        open_store(junk)
    assert junk.read_bytes() == b"this is not sqlite" * 100
    other = tmp_path / "other.db"
    import sqlite3

    with sqlite3.connect(other) as c:
        c.execute("create table people (name text)")
    with pytest.raises(StoreUnavailable, match="not an rlx ledger"):
        open_store(other, create=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junk.db", "other.db"]
