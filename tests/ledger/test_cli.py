"""``rlx ledger …`` as a user runs it: exit codes, one-line errors, named seqs, repair."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys

import pytest

from ledger import open_store
from runtime.cli import main
from runtime.rundir import RunDir
from tests.ledger.simulated import write_simulated_run


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    with open_store(RunDir(d).ledger, create=True) as store:
        write_simulated_run(store)
    return d


def rlx(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _damage(db, seq: int, cut: bool = False) -> None:
    with sqlite3.connect(db) as c:
        (body,) = c.execute("select body from rlx_events where seq = ?", (seq,)).fetchone()
        body = body[: len(body) // 2] if cut else body[:-1] + bytes([body[-1] ^ 0xFF])
        c.execute("update rlx_events set body = ? where seq = ?", (body, seq))


def test_verify_intact_run_dir_file_and_url(capsys, run_dir):
    for target in (str(run_dir), str(run_dir / "ledger.db"), f"sqlite:///{run_dir / 'ledger.db'}"):
        code, out, _ = rlx(capsys, "ledger", "verify", target)
        assert code == 0 and "run sim: OK" in out
    code, out, _ = rlx(capsys, "ledger", "verify", str(run_dir), "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"] and report["runs"][0]["head_seq"] > 100


def test_verify_names_the_first_bad_seq_of_a_flipped_byte(capsys, run_dir, tmp_path):
    copy = tmp_path / "copy.db"
    shutil.copy(run_dir / "ledger.db", copy)
    _damage(copy, 57)
    code, out, _ = rlx(capsys, "ledger", "verify", str(copy))
    assert code == 1 and "CORRUPT at seq 57" in out and "middle" in out
    code, out, _ = rlx(capsys, "ledger", "verify", str(copy), "--json")
    assert json.loads(out)["runs"][0]["first_bad_seq"] == 57
    code, _, err = rlx(capsys, "ledger", "repair", str(copy))
    assert code == 2 and "seq 57" in err and "--force" in err and "Traceback" not in err
    code, out, _ = rlx(capsys, "ledger", "verify", str(copy))
    assert code == 1  # refused: nothing was cut


def test_repair_cuts_a_torn_tail(capsys, run_dir):
    with open_store(RunDir(run_dir).ledger) as store:
        head = store.head("sim").seq
    _damage(run_dir / "ledger.db", head, cut=True)
    code, out, _ = rlx(capsys, "ledger", "verify", str(run_dir))
    assert code == 1 and f"CORRUPT at seq {head}" in out and "torn tail" in out
    code, out, _ = rlx(capsys, "ledger", "repair", str(run_dir))
    assert code == 0 and f"removed 1 events from seq {head}" in out
    code, out, _ = rlx(capsys, "ledger", "verify", str(run_dir))
    assert code == 0 and f"head seq {head - 1}" in out


def test_stats_and_tail(capsys, run_dir):
    code, out, _ = rlx(capsys, "ledger", "stats", str(run_dir), "--json")
    stats = json.loads(out)
    assert code == 0 and stats["runs"] == {"sim": stats["events"]}
    assert stats["events_by_kind"]["RolloutCompleted"] == 3 * 16 and stats["file_bytes"] > 0
    code, out, _ = rlx(capsys, "ledger", "tail", str(run_dir), "-n", "2")
    lines = out.strip().splitlines()
    assert code == 0 and len(lines) == 2 and "RunFinished" in lines[-1]
    code, out, _ = rlx(capsys, "ledger", "tail", str(run_dir), "--from", "1", "-n", "1", "--json")
    first = json.loads(out.splitlines()[0])
    assert first["seq"] == 1 and first["kind"] == "RunStarted"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["ledger", "verify", "{tmp}/missing"], "does not exist"),
        (["ledger", "stats", "ftp://x/y"], "unsupported ledger URL scheme 'ftp'"),
        (["ledger", "verify", "{tmp}/notes.txt"], "not an rlx ledger"),
        (["ledger", "verify", "{run}", "--run", "nope"], "no run 'nope'"),
        (["ledger", "tail", "{run}", "--run", "nope"], "no run 'nope'"),
        (["ledger", "tail", "{run}", "-n", "-5"], "-n -5 is not accepted"),
        (["ledger", "export", "{run}", "--out", "{tmp}/notes.txt/out"], "notes.txt' is not a directory"),
        (["ledger", "export", "{run}", "--out", "{tmp}/out", "--", "--no_such_option=1"], "unknown Beam pipeline options"),
    ],
)
def test_bad_input_is_one_line_and_creates_nothing(capsys, tmp_path, run_dir, argv, message):
    (tmp_path / "notes.txt").write_text("hello")
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = rlx(capsys, *[a.format(tmp=tmp_path, run=run_dir) for a in argv])
    assert code == 2 and message in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "notes.txt").read_text() == "hello"


@pytest.mark.slow
def test_console_script_exit_codes(tmp_path):
    (tmp_path / "d").mkdir()
    with open_store(tmp_path / "d", create=True) as store:
        write_simulated_run(store)
    out = subprocess.run([sys.executable, "-m", "runtime.cli", "ledger", "verify", str(tmp_path / "d")],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "run sim: OK" in out.stdout, out.stderr
    bad = subprocess.run([sys.executable, "-m", "runtime.cli", "ledger", "verify", str(tmp_path / "none")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("rlx: error:") and "Traceback" not in bad.stderr
