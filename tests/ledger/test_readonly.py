"""Read-only opening: inspecting a ledger never changes a byte of it, of a file that is not one,
or of the directory around it, and works where nothing can be written (a read-only mount)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys

import pytest
import sqlalchemy as sa

from ledger import LedgerError, RolloutAssigned, StoreUnavailable, open_store
from ledger.errors import ReadOnlyStore
from runtime.cli import main
from runtime.rundir import RunDir
from tests.ledger.readonly_mount import ROOT, rlx_readonly, tree_digest, unavailable
from tests.ledger.simulated import write_simulated_run


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    with open_store(RunDir(d).ledger, create=True) as store:
        write_simulated_run(store, steps=2)
    return d


def _head(directory) -> int:
    with open_store(RunDir(directory).ledger) as store:
        (run,) = store.runs()
        return store.head(run).seq


def _head_read_only(directory) -> int:
    with open_store(RunDir(directory).ledger, readonly=True) as store:
        (run,) = store.runs()
        return store.head(run).seq


def _unchanged_but_sidecars(before: dict[str, str], directory) -> None:
    """Every file as it was; in a writable directory a WAL reader may add SQLite's own empty
    ``-wal`` and its ``-shm`` index, as every SQLite reader does."""
    after = tree_digest(directory)
    empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert {k: after[k] for k in before} == before
    added = {k: v for k, v in after.items() if k not in before}
    assert set(added) <= {"ledger.db-wal", "ledger.db-shm"} and added.get("ledger.db-wal", empty) == empty


def _not_a_ledger(directory, kind: str) -> str:
    """``directory/ledger.db`` as a file that is not an rlx ledger."""
    path = os.path.join(directory, "ledger.db")
    if kind == "empty":
        open(path, "wb").close()
    elif kind == "foreign":
        with sqlite3.connect(path) as c:  # rollback-journal mode, as most SQLite files are
            c.execute("CREATE TABLE notes (body TEXT)")
            c.execute("INSERT INTO notes VALUES ('mine')")
        c.close()
    else:
        with open(path, "wb") as f:
            f.write(bytes(range(256)) * 16)
    return path


COMMANDS = [  # every reader, and repair: a writer's open checks the file before touching it too
    ["ledger", "verify", "{dir}"],
    ["ledger", "repair", "{dir}"],
    ["ledger", "stats", "{dir}"],
    ["ledger", "tail", "{dir}"],
    ["ledger", "export", "{dir}", "--out", "{out}"],
    ["audit", "{dir}", "check"],
    ["audit", "{dir}", "version", "0"],
    ["replay", "{dir}"],
]


@pytest.mark.parametrize("kind", ["empty", "foreign", "random"])
def test_a_file_that_is_not_a_ledger_is_refused_unchanged(tmp_path, capsys, kind):
    directory = tmp_path / "run"
    directory.mkdir()
    path = _not_a_ledger(directory, kind)
    before = tree_digest(directory)
    for argv in COMMANDS:
        argv = [a.format(dir=directory, out=tmp_path / "out") for a in argv]
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("rlx: error: ") and "Traceback" not in err, err
        assert path in err and "not an rlx ledger" in err, err
        assert tree_digest(directory) == before, argv
    assert not (tmp_path / "out").exists()
    for opening in ({}, {"readonly": True}):
        with pytest.raises(StoreUnavailable, match=f"^{path} is not an rlx ledger: .*expected"):
            open_store(path, **opening)
        assert tree_digest(directory) == before
    if kind == "foreign":
        with sqlite3.connect(path) as c:
            assert c.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        c.close()


def test_a_read_only_store_reads_everything_and_refuses_every_write(run_dir):
    before = tree_digest(run_dir)
    with open_store(RunDir(run_dir).ledger, readonly=True) as store:
        (run,) = store.runs()
        head = store.head(run)
        assert store.verify(run).ok and store.verify(run).head_seq == head.seq > 50
        assert len(list(store.read(run))) == head.seq and store.stats()["events"] == head.seq
        writes = {
            "create run 'other'": lambda: store.create_run("other"),
            f"take the writer epoch of run '{run}'": lambda: store.acquire_epoch(run),
            f"append to run '{run}'": lambda: store.append(run, [RolloutAssigned("w", (0,), (0,))],
                                                           expected_seq=head.seq, epoch=store.writer_epoch(run)),
            f"repair run '{run}'": lambda: store.repair(run, force=True),
            f"cut run '{run}'": lambda: store._truncate(run, 1),
        }
        for what, write in writes.items():
            with pytest.raises(ReadOnlyStore, match=f"^ledger sqlite:///{run_dir}/ledger.db is opened read-only: "
                                                    f"cannot {what}$"):
                write()
        assert store.head(run) == head
    _unchanged_but_sidecars(before, run_dir)


def test_a_reader_beside_a_live_writer_sees_each_commit(run_dir):
    ledger = RunDir(run_dir).ledger
    with open_store(ledger) as writer, open_store(ledger, readonly=True) as reader:
        (run,) = writer.runs()
        epoch = writer.acquire_epoch(run)
        head = reader.head(run).seq
        writer.append(run, [RolloutAssigned("w", (0,), (0,))], expected_seq=head, epoch=epoch)
        assert reader.head(run).seq == head + 1 and reader.writer_epoch(run) == epoch


@pytest.mark.postgres
def test_postgres_read_only_sessions_and_no_ddl(pg_url):
    psycopg = pytest.importorskip("psycopg")
    with pytest.raises(StoreUnavailable, match="not an rlx ledger"):
        open_store(pg_url, readonly=True)
    name = pg_url.rsplit("%3D", 1)[1]  # the fixture's fresh schema
    with psycopg.connect(pg_url.split("?")[0]) as admin:
        tables = admin.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = %s",
                               (name,)).fetchone()
    assert tables == (0,)  # the read-only open created nothing
    with open_store(pg_url, create=True) as store:
        run = write_simulated_run(store, steps=1)
    with open_store(pg_url, readonly=True) as store:
        head = store.head(run)
        assert store.verify(run).ok and store.runs() == [run]
        with store._read_engine.connect() as conn:
            assert conn.execute(sa.text("SHOW default_transaction_read_only")).scalar() == "on"
        for write in (lambda: store.create_run("other"), lambda: store.acquire_epoch(run)):
            with pytest.raises(LedgerError, match="opened read-only"):
                write()
        assert store.head(run) == head


# -- a read-only mount --------------------------------------------------------------------------

needs_mount = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))


def _one_line_error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("rlx: error: "), done.stderr
    return done.stderr


@pytest.mark.slow
@needs_mount
def test_every_ledger_reader_works_on_a_read_only_mount(run_dir, tmp_path):
    head = _head(run_dir)
    before = tree_digest(run_dir)
    assert sorted(before) == ["ledger.db"]  # a closed ledger: no -wal or -shm next to it
    done = rlx_readonly(run_dir, "ledger", "verify", str(run_dir), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["runs"][0]["head_seq"] == head
    done = rlx_readonly(run_dir, "ledger", "stats", str(run_dir), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["events"] == head, done.stderr
    done = rlx_readonly(run_dir, "ledger", "tail", str(run_dir), "-n", "2", "--json")
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["seq"] for line in done.stdout.splitlines()] == [head - 1, head]
    done = rlx_readonly(run_dir, "ledger", "export", str(run_dir), "--out", str(tmp_path / "out"), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["events"] == head
    assert tree_digest(run_dir) == before


_CRASHING_WRITER = """
import os, signal, sys
from ledger import open_store
from runtime.rundir import RunDir
from tests.ledger.simulated import write_simulated_run
store = open_store(RunDir(sys.argv[1]).ledger, create=True)
run = write_simulated_run(store, steps=2)
print(store.head(run).seq, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
@needs_mount
def test_a_copy_of_a_crashed_writers_run_directory_reads_on_a_read_only_mount(tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    done = subprocess.run([sys.executable, "-c", _CRASHING_WRITER, str(live)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=300, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr
    head = int(done.stdout)
    copy = tmp_path / "copy"
    shutil.copytree(live, copy)
    assert os.path.getsize(copy / "ledger.db-wal") > 0 and (copy / "ledger.db-shm").exists()
    before = tree_digest(live)
    assert _head_read_only(live) == head  # in place, without the writer that left the -wal
    assert tree_digest(live)["ledger.db"] == before["ledger.db"]
    before = tree_digest(copy)
    done = rlx_readonly(copy, "ledger", "verify", str(copy), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["runs"][0]["head_seq"] == head  # the events only in the -wal too
    assert tree_digest(copy) == before

    # Without its -shm, SQLite can read the -wal only by writing a new -shm: a one-line refusal
    # that says what to do, never an immutable read that silently drops the -wal's events.
    os.remove(copy / "ledger.db-shm")
    err = _one_line_error(rlx_readonly(copy, "ledger", "verify", str(copy)))
    assert f"{copy}/ledger.db-wal" in err and "writable" in err


@needs_mount
@pytest.mark.parametrize("kind", ["empty", "foreign", "random"])
def test_a_file_that_is_not_a_ledger_on_a_read_only_mount_is_one_line(tmp_path, kind):
    path = _not_a_ledger(tmp_path, kind)
    err = _one_line_error(rlx_readonly(tmp_path, "ledger", "verify", str(tmp_path)))
    assert f"{path} is not an rlx ledger" in err
