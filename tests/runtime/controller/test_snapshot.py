"""Controller snapshots: resuming from any snapshot gives the fold from seq 1; bad ones are skipped."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger import open_store
from ledger.store import StoredSnapshot
from runtime.config import load_config
from runtime.controller import ControllerLoop, replay, snapshot
from runtime.controller.simulation import run_to_end
from tests.runtime.controller.golden.regenerate import COMMON

RUN = "snap"


def _config(mode: str, staleness: int, filtered: bool, steps: int):
    return load_config(None, COMMON + [f"run.steps={steps}", f"scheduling.mode={mode}",
                                       f"scheduling.max_staleness={staleness}",
                                       f"scheduling.filter_groups={'true' if filtered else 'false'}"], data_size=10)


def _drive(store, config, every: int, rounds: int) -> ControllerLoop:
    loop = ControllerLoop.create(store, run_id=RUN, config=config.to_dict(), config_digest=config.digest(),
                                 seed=config.run.seed, snapshot_every=every)
    try:
        run_to_end(loop, workers=2, slots=2, max_rounds=rounds)
    except RuntimeError:
        pass  # stopped mid-run on purpose: the snapshot points fall anywhere in a live run
    return loop


def _same(a: snapshot.Recovered, b: snapshot.Recovered) -> None:
    assert (a.seq, a.digest) == (b.seq, b.digest)
    assert a.state == b.state
    assert snapshot.encode(a.state, a.cache) == snapshot.encode(b.state, b.cache)  # cache too, orders included


def _spoil(store, snap: StoredSnapshot, how: str) -> None:
    if how == "body":  # a flipped bit, the checksum left as it was
        i = len(snap.body) // 2
        bad = StoredSnapshot(snap.run_id, snap.seq, snap.format, snap.chain_digest,
                             snap.body[:i] + bytes([snap.body[i] ^ 1]) + snap.body[i + 1:], snap.checksum)
    elif how == "digest":  # consistent, but not the chain at its seq (e.g. a log cut and rewritten)
        d = bytes(32)
        bad = StoredSnapshot(snap.run_id, snap.seq, snap.format, d, snap.body, snapshot.checksum(d, snap.body))
    else:  # written by newer software
        bad = StoredSnapshot(snap.run_id, snap.seq, snapshot.FORMAT + 1, snap.chain_digest, snap.body, snap.checksum)
    store.put_snapshot(bad, keep=snapshot.KEPT)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mode=st.sampled_from(["deterministic", "freshest"]), staleness=st.integers(0, 1), filtered=st.booleans(),
       every=st.integers(1, 60), rounds=st.integers(1, 40), spoil=st.sampled_from(["body", "digest", "format"]))
def test_resuming_from_any_snapshot_is_the_fold_from_seq_1(mode, staleness, filtered, every, rounds, spoil):
    config = _config(mode, staleness, filtered, steps=3)
    store = open_store("memory://")
    loop = _drive(store, config, every, rounds)
    full = snapshot.recover(store, RUN, snapshots=False)
    assert full.state == loop.state
    assert snapshot.encode(full.state, full.cache) == snapshot.encode(loop.state, loop.cache)
    snaps = store.snapshots(RUN)
    assert [s.seq for s in snaps] == sorted((s.seq for s in snaps), reverse=True)
    assert len(snaps) <= snapshot.KEPT and (snaps or store.head(RUN).seq < every)
    for snap in snaps:  # every snapshot is the fold up to its seq, and resuming from it reaches the head
        at = snapshot.check(store, RUN, snap)
        _same(at, snapshot.fold_prefix(store, RUN, snap.seq))
        _same(snapshot.recover(store, RUN, start=at), full)
    fast = snapshot.recover(store, RUN)
    _same(fast, full)
    assert fast.snapshot_seq == (snaps[0].seq if snaps else 0)
    assert fast.folded == full.folded - fast.snapshot_seq
    if snaps:
        warnings: list[str] = []
        _spoil(store, snaps[0], spoil)
        again = snapshot.recover(store, RUN, warn=warnings.append)
        _same(again, full)
        assert again.snapshot_seq == (snaps[1].seq if len(snaps) > 1 else 0)
        assert len(warnings) == 1 and f"at seq {snaps[0].seq}" in warnings[0]


def test_a_run_resumed_from_a_snapshot_finishes_with_a_replayable_log():
    config = _config("deterministic", 1, True, steps=4)
    ref = open_store("memory://")
    _drive(ref, config, 0, 100_000)
    store = open_store("memory://")
    _drive(store, config, 25, 12)
    loop = ControllerLoop.resume(store, RUN, snapshot_every=25)
    assert 0 < loop.snapshot_seq < loop.head_seq
    run_to_end(loop, workers=2, slots=2)
    events = store.events(RUN)
    replay(events, check=True)
    assert events[-1] == ref.events(RUN)[-1]  # the same final version and digest


def test_sqlite_snapshots_survive_reopening_are_cut_by_repair_and_old_ledgers_get_the_table(tmp_path):
    path = str(tmp_path / "ledger.db")
    config = _config("freshest", 1, False, steps=2)
    with open_store(path, create=True) as store:
        _drive(store, config, 10, 100_000)
        snaps = store.snapshots(RUN)
        head = store.head(RUN).seq
    assert len(snaps) == snapshot.KEPT
    with open_store(path, readonly=True) as reader:
        assert reader.snapshots(RUN) == snaps
        _same(snapshot.recover(reader, RUN), snapshot.recover(reader, RUN, snapshots=False))
    with sqlite3.connect(path) as conn:  # a stored bit flips
        conn.execute("UPDATE rlx_snapshots SET body = CAST(? AS BLOB) WHERE seq = ?", (b"\x80" * 8, snaps[0].seq))
    with open_store(path) as store:
        warnings: list[str] = []
        assert snapshot.recover(store, RUN, warn=warnings.append).snapshot_seq == snaps[1].seq
        assert "checksum" in warnings[0]
        store._truncate(RUN, snaps[1].seq + 1)  # what `repair` does to a torn tail
        assert [s.seq for s in store.snapshots(RUN)] == [s.seq for s in snaps[1:]]
        assert head > snaps[1].seq
    with sqlite3.connect(path) as conn:  # a ledger written before snapshots existed
        conn.execute("DROP TABLE rlx_snapshots")
    with open_store(path, readonly=True) as reader:
        assert reader.snapshots(RUN) == []
    with open_store(path) as store:
        assert store.snapshots(RUN) == []
        assert snapshot.recover(store, RUN).snapshot_seq == 0


_CRASH = """
import sys
from ledger import open_store
from runtime.controller import ControllerLoop
from runtime.controller.simulation import run_to_end
from tests.runtime.controller.test_snapshot import _config, RUN
config = _config("deterministic", 1, True, steps=3)
store = open_store(sys.argv[1], create=True)
loop = ControllerLoop.create(store, run_id=RUN, config=config.to_dict(), config_digest=config.digest(),
                             seed=config.run.seed, snapshot_every=30)
run_to_end(loop, workers=2, slots=2)
"""


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_kill_during_a_snapshot_write_leaves_the_ledger_valid_and_resume_correct(backend, tmp_path, request):
    path = str(tmp_path / "ledger.db") if backend == "sqlite" else request.getfixturevalue("pg_url")
    env = {**os.environ, "RLX_FAILPOINTS": "ledger.snapshot@2", "RLX_TEST_FAILPOINTS": "1", "PYTHONPATH": os.getcwd()}
    proc = subprocess.run([sys.executable, "-c", _CRASH, path], env=env, capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    with open_store(path) as store:
        assert store.verify(RUN).ok
        snaps = store.snapshots(RUN)
        assert len(snaps) == 1  # the first; the second died uncommitted
        head = store.head(RUN).seq
        assert head > snaps[0].seq
        rec = snapshot.recover(store, RUN)
        assert rec.snapshot_seq == snaps[0].seq and rec.seq == head
        _same(rec, snapshot.recover(store, RUN, snapshots=False))
        loop = ControllerLoop.resume(store, RUN, snapshot_every=30)
        run_to_end(loop, workers=2, slots=2)
        assert loop.finished
        replay(store.events(RUN), check=True)


@pytest.mark.parametrize("every", [0, 1])
def test_snapshot_every_zero_writes_none_and_one_writes_after_every_append(every):
    store = open_store("memory://")
    loop = _drive(store, _config("freshest", 0, False, steps=1), every, 100_000)
    snaps = store.snapshots(RUN)
    assert len(snaps) == (0 if every == 0 else snapshot.KEPT)
    if every:
        assert snaps[0].seq == loop.head_seq


@pytest.mark.postgres
def test_postgresql_snapshots_survive_reopening_are_skipped_when_corrupt_and_cut_by_repair(pg_url):
    import psycopg

    config = _config("freshest", 1, False, steps=2)
    with open_store(pg_url, create=True) as store:
        loop = _drive(store, config, 10, 100_000)
        assert loop.finished and loop.snapshot_error is None
        snaps = store.snapshots(RUN)
        head = store.head(RUN).seq
    assert len(snaps) == snapshot.KEPT  # keep=KEPT pruned the older ones
    assert [s.seq for s in snaps] == sorted((s.seq for s in snaps), reverse=True) and snaps[0].seq <= head
    with open_store(pg_url, readonly=True) as reader:  # a new connection sees the same rows, bytes intact
        assert reader.snapshots(RUN) == snaps
        for snap in snaps:
            _same(snapshot.check(reader, RUN, snap), snapshot.fold_prefix(reader, RUN, snap.seq))
        fast = snapshot.recover(reader, RUN)
        assert fast.snapshot_seq == snaps[0].seq
        _same(fast, snapshot.recover(reader, RUN, snapshots=False))
    with psycopg.connect(pg_url, autocommit=True) as conn:  # a stored bit flips
        conn.execute("UPDATE rlx_snapshots SET body = %s WHERE run_id = %s AND seq = %s",
                     (b"\x80" * 8, RUN, snaps[0].seq))
    with open_store(pg_url) as store:
        warnings: list[str] = []
        rec = snapshot.recover(store, RUN, warn=warnings.append)
        assert rec.snapshot_seq == snaps[1].seq and rec.seq == head
        assert len(warnings) == 1 and f"at seq {snaps[0].seq}" in warnings[0] and "checksum" in warnings[0]
        _same(rec, snapshot.recover(store, RUN, snapshots=False))
        store._truncate(RUN, snaps[1].seq + 1)  # what `repair` does to a torn tail
        assert [s.seq for s in store.snapshots(RUN)] == [s.seq for s in snaps[1:]]
        assert store.head(RUN).seq == snaps[1].seq
        loop = ControllerLoop.resume(store, RUN, snapshot_every=10)  # continues from the kept snapshot
        assert loop.snapshot_seq == snaps[1].seq
        run_to_end(loop, workers=2, slots=2)
        assert loop.finished and loop.snapshot_error is None
        replay(store.events(RUN), check=True)
        after = store.snapshots(RUN)
        assert len(after) == snapshot.KEPT and after[0].seq > snaps[1].seq
        _same(snapshot.recover(store, RUN), snapshot.recover(store, RUN, snapshots=False))
    with psycopg.connect(pg_url, autocommit=True) as conn:  # a ledger written before snapshots existed
        conn.execute("DROP TABLE rlx_snapshots")
    with open_store(pg_url, readonly=True) as reader:
        assert reader.snapshots(RUN) == []
    with open_store(pg_url) as store:  # a writable open adds the table back, empty
        assert store.snapshots(RUN) == []
        assert snapshot.recover(store, RUN).snapshot_seq == 0
        rec = snapshot.recover(store, RUN)
        snapshot.write(store, RUN, rec.seq, rec.digest, rec.state, rec.cache)
        assert [s.seq for s in store.snapshots(RUN)] == [rec.seq]


def test_failed_snapshot_writes_are_told_once_and_again_when_they_recover(monkeypatch):
    from runtime import failpoints

    # The 2nd, 3rd and 4th snapshot writes fail as a failing disk would (RLX_FAILPOINTS syntax).
    monkeypatch.setattr(failpoints, "_ARMED", failpoints._parse("ledger.snapshot@2:raise=3"))
    monkeypatch.setattr(failpoints, "_SEEN", {})
    store = open_store("memory://")
    config = _config("deterministic", 1, True, steps=3)
    lines: list[str] = []
    loop = ControllerLoop.create(store, run_id=RUN, config=config.to_dict(), config_digest=config.digest(),
                                 seed=config.run.seed, snapshot_every=10, warn=lines.append)
    run_to_end(loop, workers=2, slots=2)
    assert loop.finished and loop.snapshot_error is None and loop.snapshot_failures == 0
    assert failpoints._SEEN["ledger.snapshot"] >= 5, "the run must write enough snapshots for the test"
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"warning: snapshot of run {RUN!r} at seq ") and "not written" in lines[0]
    assert "failpoint ledger.snapshot (reach 2)" in lines[0] and "later failures are not repeated" in lines[0]
    assert lines[1].startswith(f"snapshots of run {RUN!r} are written again") and "after 3 failed writes" in lines[1]
    snaps = store.snapshots(RUN)  # the failed writes left nothing; the good ones are usable
    assert len(snaps) == snapshot.KEPT
    _same(snapshot.recover(store, RUN), snapshot.recover(store, RUN, snapshots=False))
    replay(store.events(RUN), check=True)
