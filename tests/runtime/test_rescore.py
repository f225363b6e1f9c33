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
from ledger import open_store
from runtime.cli import main
from runtime.config import Config
from runtime.rundir import write_run_pointer
from tests.runtime.test_fork import _run, _stored, _summary
from tests.runtime.test_taint import _flip


def _copy_ledger(events, url: str) -> None:
    with open_store(url, create=True) as store:
        store.create_run("run")
        store.append("run", events, expected_seq=0, epoch=store.acquire_epoch("run"))


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
    _copy_ledger([s.event for s in _stored(buggy)], pg_url)
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
    from runtime.run import run
    from runtime.tasks import CodeFunctions

    generated = CodeFunctions()
    data = tmp_path / "fns.jsonl"
    data.write_text("".join(json.dumps(generated.data_row(i)) + "\n" for i in range(12)), encoding="utf-8")
    config = Config.from_dict({  # 3 steps of 4 groups of 4 function bodies, judged in the sandbox
        "run": {"steps": 3, "seed": 0},
        "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64},
        "pretrain": {"steps": 200, "batch_size": 32, "cache_dir": str(tmp_path / "warm")},
        "eval": {"size": 4},
        "data": {"task": "codefn", "path": str(data)},
        "sampling": {"group_size": 4, "max_tokens": 12},
        "scheduling": {"groups_per_batch": 4, "max_staleness": 1},
        "workers": {"inference_slots": 16, "mode": "threads"},
        "params": {"keep_newest": 10},
    })
    clean = tmp_path / "code"
    run(config, str(clean), progress=False, log=lambda m: None)
    events = _stored(clean)
    scored = sorted(s.event.rollout_id for s in events if isinstance(s.event, ev.OutcomeRecorded))
    bad = set(scored[25::50])  # one outcome in 50, the 26th first
    edited = tmp_path / "edited"
    os.makedirs(edited)
    _copy_ledger([_flip(s.event) if isinstance(s.event, ev.OutcomeRecorded) and s.event.rollout_id in bad
                  else s.event for s in events], f"{edited}/ledger.db")
    shutil.copytree(clean / "params", edited / "params")
    doc = _rescored(edited, "builtin", tmp_path / "rescored", capsys)
    assert doc["first_tainted_version"] >= 1 and doc["final_digest"] == _summary(clean)["final_digest"]
    flipped = [s for s in _stored(edited) if isinstance(s.event, ev.OutcomeRecorded) and s.event.rollout_id in bad]
    forked = next(s.event for s in _stored(tmp_path / "rescored") if isinstance(s.event, ev.RunForked))
    assert forked.parent_seq == flipped[0].seq - 1  # just before the first outcome judged otherwise
    assert main(["replay", str(tmp_path / "rescored")]) == 0
