"""``rlx replay RUN --rescore VERIFIER --out DIR`` beyond the math run of ``test_fork``: a run
on a PostgreSQL ledger, and a code-task run whose recorded outcomes a buggy code verifier turned
round. Each re-scored run must end on the weights of a run that was judged right from the start.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from ledger import events as ev
from runtime.cli import main
from runtime.rundir import write_run_pointer
from tests.runtime.test_fork import _run, _stored, _summary
from tests.runtime.test_taint import code_run, copy_events, flipped_outcomes


def _rescored(out, verifier, target, capsys) -> dict:
    capsys.readouterr()
    assert main(["replay", str(out), "--rescore", verifier, "--out", str(target), "--no-progress", "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The buggy 4-step math run of ``test_fork`` and the same run scored right from the start."""
    from tests.runtime import small_run
    from tests.runtime.test_taint import BUGGY, RIGHT

    root = tmp_path_factory.mktemp("rescore")
    small_run.write_sums(root / "sums.jsonl")
    (root / "buggy.py").write_text(BUGGY, encoding="utf-8")
    (root / "right.py").write_text(RIGHT, encoding="utf-8")
    return root, _run(root, root / "buggy", "buggy.py"), _run(root, root / "clean", "right.py")


@pytest.mark.slow
@pytest.mark.postgres
def test_a_rescored_replay_of_a_run_on_a_postgresql_ledger(runs, pg_url, tmp_path, capsys):
    root, buggy, clean = runs
    moved = tmp_path / "pg_run"
    os.makedirs(moved)
    copy_events(_stored(buggy), pg_url)
    write_run_pointer(moved, pg_url, "run")
    shutil.copytree(os.path.join(buggy, "params"), moved / "params")
    doc = _rescored(moved, str(root / "right.py"), tmp_path / "rescored", capsys)
    assert doc["final_digest"] == _summary(clean)["final_digest"] != _summary(buggy)["final_digest"]
    forked = next(s.event for s in _stored(tmp_path / "rescored") if isinstance(s.event, ev.RunForked))
    assert forked.reason == "rescore" and forked.parent_run == "run"
    assert main(["ledger", "verify", str(tmp_path / "rescored")]) == 0


@pytest.mark.slow
def test_a_rescored_replay_of_a_code_run_whose_verifier_turned_outcomes_round(tmp_path, capsys):
    """A code run whose recorded outcomes (a fixed 2%) were turned round, as a code verifier with
    that bug would have recorded them: re-scored with the built-in code verifier, it ends on the
    weights of the run as it really was judged."""
    clean = code_run(tmp_path, params={"keep_newest": 10})
    events = _stored(clean)
    bad = flipped_outcomes(events)
    edited = tmp_path / "edited"
    os.makedirs(edited)
    copy_events(events, f"{edited}/ledger.db", bad)
    shutil.copytree(os.path.join(clean, "params"), edited / "params")
    doc = _rescored(edited, "builtin", tmp_path / "rescored", capsys)
    assert doc["first_tainted_version"] >= 1 and doc["final_digest"] == _summary(clean)["final_digest"]
    flipped = [s for s in _stored(edited) if isinstance(s.event, ev.OutcomeRecorded) and s.event.rollout_id in bad]
    forked = next(s.event for s in _stored(tmp_path / "rescored") if isinstance(s.event, ev.RunForked))
    assert forked.parent_seq == flipped[0].seq - 1  # just before the first outcome judged otherwise
    assert main(["replay", str(tmp_path / "rescored")]) == 0
