"""A snapshot is trusted only where the log commits to it: a forged row is skipped on resume,
named by ``rlx ledger verify``, and the snapshot a resume started from is in its
``ControllerStarted``, provable after the row is gone."""

from __future__ import annotations

import sqlite3

from ledger import events as ev
from ledger import open_store
from runtime.cli import main
from runtime.controller import ControllerLoop, replay, snapshot
from runtime.controller.simulation import run_to_end
from tests.runtime.controller.test_snapshot import RUN, _config, _drive, _same


def _forge(path: str, snap, body: bytes) -> None:
    """What whoever can write the database can do: a new body under the row's seq and chain
    digest, with the checksum recomputed (it has no key)."""
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE rlx_snapshots SET body = ?, checksum = ? WHERE run_id = ? AND seq = ?",
                     (body, snapshot.checksum(snap.chain_digest, body), RUN, snap.seq))


def _other_state(snap) -> bytes:
    """The row's state with the prompt stream moved on: a resume from it would train on other data."""
    state, cache = snapshot.decode(snap.body)
    return snapshot.encode(state._replace(position=state.position + 7), cache)


def test_the_controller_commits_to_each_snapshot_in_the_log(tmp_path):
    path = str(tmp_path / "ledger.db")
    with open_store(path, create=True) as store:
        _drive(store, _config("deterministic", 1, True, steps=3), 10, 100_000)
        snaps = store.snapshots(RUN)
        events = {s.seq: s.event for s in store.read(RUN)}
    assert len(snaps) == snapshot.KEPT
    for snap in snaps:  # each row sits at its own SnapshotTaken, which names its body's digest
        taken = events[snap.seq]
        assert isinstance(taken, ev.SnapshotTaken)
        assert taken.digest == snapshot.body_digest(snap.body) and taken.format == snapshot.FORMAT
    replay(list(events.values()), check=True)  # the commitments change no decision


def test_a_forged_snapshot_with_a_valid_checksum_is_skipped_named_and_the_resume_ends_honest(tmp_path, capsys):
    config = _config("deterministic", 1, True, steps=4)
    reference = open_store("memory://")
    _drive(reference, config, 0, 100_000)
    path = str(tmp_path / "ledger.db")
    with open_store(path, create=True) as store:
        _drive(store, config, 10, 14)  # stopped mid-run
        snaps = store.snapshots(RUN)
    assert len(snaps) == snapshot.KEPT
    newest, older = snaps[0], snaps[1]
    _forge(path, newest, _other_state(newest))

    assert main(["ledger", "verify", path]) == 1  # the chain holds; the row is not the fold
    out = capsys.readouterr().out
    assert f"SNAPSHOT at seq {newest.seq} (stored row) is not the fold of the log" in out
    assert "'position' differs from the fold's" in out

    with open_store(path) as store:
        warnings: list[str] = []
        rec = snapshot.recover(store, RUN, warn=warnings.append)
        assert rec.snapshot_seq == older.seq  # the forged row is skipped, the next older one used
        assert len(warnings) == 1 and f"at seq {newest.seq}" in warnings[0]
        assert "is not the one the log commits to" in warnings[0] and "rewritten" in warnings[0]
        _same(rec, snapshot.recover(store, RUN, snapshots=False))  # the honest fold

        lines: list[str] = []
        loop = ControllerLoop.resume(store, RUN, snapshot_every=10, warn=lines.append)
        started = [s.event for s in store.read(RUN) if s.kind == "ControllerStarted"][-1]
        assert (started.snapshot_seq, started.snapshot_digest) == (older.seq, snapshot.body_digest(older.body))
        assert any(f"at seq {newest.seq}" in m for m in lines)
        run_to_end(loop, workers=2, slots=2)
        assert loop.finished
        events = store.events(RUN)
    replay(events, check=True)

    def finished(events):
        return [e for e in events if isinstance(e, ev.RunFinished)]

    assert finished(events) == finished(reference.events(RUN))  # the final version and digest of a run never forged
    assert main(["ledger", "verify", path]) == 1  # the forged row, while it is kept, is named; nothing else
    bad = [line for line in capsys.readouterr().out.splitlines() if "SNAPSHOT" in line]
    assert len(bad) == 1 and f"at seq {newest.seq} (stored row)" in bad[0]
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM rlx_snapshots WHERE seq = ?", (newest.seq,))
    assert main(["ledger", "verify", path]) == 0  # what the resume started from, and every commitment, proven
    assert "snapshots proven" in capsys.readouterr().out


def test_a_resume_from_a_forged_snapshot_stays_named_after_its_row_is_pruned(tmp_path, capsys):
    """Software that trusted a forged row (here: handed to the resume as its fold) leaves its
    body digest in ControllerStarted, so verify names it even once every row is gone."""
    path = str(tmp_path / "ledger.db")
    with open_store(path, create=True) as store:
        _drive(store, _config("freshest", 1, False, steps=3), 10, 14)
        newest = store.snapshots(RUN)[0]
        body = _other_state(newest)
        state, cache = snapshot.decode(body)
        store._truncate(RUN, newest.seq + 1)  # the log up to the snapshot: the forged state is the head's
        forged = snapshot.Recovered(newest.seq, newest.chain_digest, state, cache, snapshot_seq=newest.seq,
                                    snapshot_digest=snapshot.body_digest(body))
        loop = ControllerLoop.resume(store, RUN, start=forged)
        starts = [s for s in store.read(RUN) if s.kind == "ControllerStarted"]
        assert starts[-1].event.snapshot_digest == snapshot.body_digest(body) and loop.epoch == 2
    with sqlite3.connect(path) as conn:  # pruned
        conn.execute("DELETE FROM rlx_snapshots")
    assert main(["ledger", "verify", path]) == 1
    out = capsys.readouterr().out
    assert f"SNAPSHOT at seq {newest.seq} (named by seq {starts[-1].seq}) is not the fold of the log" in out
    assert "ControllerStarted" in out and snapshot.body_digest(body)[:16] in out


def test_a_row_the_log_does_not_commit_to_is_skipped(tmp_path):
    """A row written beside the log without its SnapshotTaken (by hand, or by software from before
    snapshots were committed) is not trusted: the resume folds from seq 1."""
    with open_store(str(tmp_path / "ledger.db"), create=True) as store:
        _drive(store, _config("deterministic", 1, True, steps=2), 0, 12)
        rec = snapshot.recover(store, RUN, snapshots=False)
        snapshot.write(store, RUN, rec.seq, rec.digest, rec.state, rec.cache)
        warnings: list[str] = []
        assert snapshot.recover(store, RUN, warn=warnings.append).snapshot_seq == 0
        assert len(warnings) == 1 and "the log does not commit to it" in warnings[0]
        assert snapshot.proofs(store, RUN) == [snapshot.Proof(rec.seq, True)]  # it is the fold, though
