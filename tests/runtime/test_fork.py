"""``rlx fork`` and ``rlx replay --rescore``: a run that shares its parent's history up to a
version and goes on with some settings changed, on real tiny runs (the built-in model on
two-digit sums, deterministic mode, the roles as threads).

The parent is the injected-bug run of ``test_taint``: a reward file that flips a known 2% of the
outcomes. A fork with nothing changed ends on the parent's final weights; a fork with another
learning rate shares the parent's chain up to the fork point, verifies, replays bit for bit and
passes the audit; a fork of that fork works; a re-scored replay with the right reward file ends
on the weights of a run that had it from the start.
"""

from __future__ import annotations

import json
import os

import pytest

from ledger import events as ev
from ledger import open_store
from runtime.cli import main
from tests.runtime import small_run
from tests.runtime.test_taint import BUGGY, RIGHT

STEPS = 4


def _run(root, out, reward: str, *more: str) -> str:
    argv = ["run", "--out", str(out), "--no-progress", "--steps", str(STEPS), "--data", str(root / "sums.jsonl"),
            "--set", f'pretrain.cache_dir="{root / "warm"}"', "--set", "sampling.max_tokens=4",
            "--set", f'verifier.reward="{root / reward}"', "--set", 'workers.mode="threads"',
            "--set", "params.keep_newest=10", "--set", "eval.every_steps=0", "--set", "ledger.snapshot_every=40"]
    for o in small_run.TINY:
        argv += ["--set", o]
    assert main([*argv, *more]) == 0
    return str(out)


def test_the_settings_a_fork_may_change_and_what_it_records_of_them(tmp_path):
    import hashlib

    from runtime.errors import UsageError
    from runtime.fork import changeable, fork_config

    logged = small_run.tiny_config("sums.jsonl", "warm").resolved(data_size=25).to_dict()
    config, changes = fork_config(logged, ["trainer.learning_rate=0.5", "run.steps=9"], requested=3)
    assert changes == {"run.steps": [small_run.STEPS, 9], "trainer.learning_rate": [1e-2, 0.5]}
    assert (config.trainer.learning_rate, config.run.steps, config.params.url, config.ledger.url) == (0.5, 9, None, None)
    assert fork_config(logged, [], requested=3)[1] == {}
    (tmp_path / "mine.py").write_text(RIGHT, encoding="utf-8")
    config, changes = fork_config(logged, [], requested=3, values={"verifier.reward": str(tmp_path / "mine.py")})
    digest = hashlib.sha256(RIGHT.encode()).hexdigest()
    assert config.verifier.reward_digest == digest
    assert changes == {"verifier.reward": [None, str(tmp_path / "mine.py")], "verifier.reward_digest": [None, digest]}
    with pytest.raises(UsageError) as refused:
        fork_config(logged, ["model.hidden_size=64"], requested=3)
    assert str(refused.value) == ("--set model.hidden_size=64: model.hidden_size cannot change mid-run (it shapes what "
                                  "the parent already sampled or decided); a fork may change " + ", ".join(changeable()))
    with pytest.raises(UsageError, match=r"^--set run.steps=2: the parent had already requested batch 3 at the fork "):
        fork_config(logged, ["run.steps=2"], requested=3)


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    """A 4-step math run scored by ``BUGGY`` that keeps every version; (root, run directory)."""
    root = tmp_path_factory.mktemp("fork")
    small_run.write_sums(root / "sums.jsonl")
    (root / "buggy.py").write_text(BUGGY, encoding="utf-8")
    (root / "right.py").write_text(RIGHT, encoding="utf-8")
    return root, _run(root, root / "parent", "buggy.py")


def _summary(out) -> dict:
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        return json.load(f)


def _stored(out) -> list:
    with open_store(str(out), readonly=True) as store:
        return list(store.read("run"))


@pytest.mark.slow
def test_a_fork_with_nothing_changed_ends_on_the_parents_weights(parent, tmp_path):
    root, out = parent
    fork = tmp_path / "same"
    assert main(["fork", out, "--at", "2", "--out", str(fork), "--no-progress"]) == 0
    assert _summary(fork)["final_digest"] == _summary(out)["final_digest"]
    mine, theirs = _stored(fork), _stored(out)
    forked = next(s for s in mine if isinstance(s.event, ev.RunForked))
    published = next(s for s in theirs if isinstance(s.event, ev.WeightsPublished) and s.event.version == 2)
    assert forked.seq == published.seq + 1 and forked.event.parent_seq == published.seq
    assert forked.event.parent_digest == published.digest.hex() == mine[published.seq - 1].digest.hex()
    assert [s.digest for s in mine[:published.seq]] == [s.digest for s in theirs[:published.seq]]
    assert forked.event.changes == {} and forked.event.version == 2 and forked.event.parent == out
    steps = [s.event.step for s in mine[forked.seq:] if isinstance(s.event, ev.TrainStepCompleted)]
    assert steps == [3, 4]  # trained again in the fork, not copied
    started = [s.event for s in mine[forked.seq:] if isinstance(s.event, ev.ControllerStarted)]
    taken = [s.seq for s in theirs[:published.seq] if isinstance(s.event, ev.SnapshotTaken)]
    assert taken and started[0].snapshot_seq == taken[-1]  # its fold began at the parent's snapshot before the cut


@pytest.mark.slow
def test_a_fork_with_another_learning_rate_verifies_replays_and_passes_the_audit_and_can_be_forked(
        parent, tmp_path, capsys):
    root, out = parent
    fork = str(tmp_path / "lr")
    assert main(["fork", out, "--at", "1", "--out", fork, "--no-progress", "--set", "trainer.learning_rate=3e-3"]) == 0
    mine, theirs = _stored(fork), _stored(out)
    forked = next(s.event for s in mine if isinstance(s.event, ev.RunForked))
    assert forked.changes == {"trainer.learning_rate": (small_run_lr(out), 3e-3)} and forked.version == 1
    assert forked.config["trainer"]["learning_rate"] == 3e-3
    parts = [s.digest for s in mine[:forked.parent_seq]] == [s.digest for s in theirs[:forked.parent_seq]]
    assert parts
    digest = {v: d for v, d in _versions(mine).items()}
    assert digest[1] == _versions(theirs)[1] and digest[STEPS] != _versions(theirs)[STEPS]

    def requested(stored):  # after the fork point: the groups the fork requested itself
        return {s.event.group_id: (s.event.batch, s.event.ordinal, s.event.prompt_index, s.event.seeds)
                for s in stored[forked.parent_seq:] if isinstance(s.event, ev.RolloutRequested)}

    ours = requested(mine)
    assert ours and {g: requested(theirs)[g] for g in ours} == ours  # common random numbers: prompts and seeds
    capsys.readouterr()
    assert main(["ledger", "verify", fork, "--json"]) == 0
    verified = json.loads(capsys.readouterr().out)
    assert verified["ok"] and verified["runs"][0]["forked_from"][0]["parent_checked"]
    assert verified["runs"][0]["forked_from"][0]["parent_seq"] == forked.parent_seq
    assert main(["replay", fork, "--json"]) == 0
    replayed = json.loads(capsys.readouterr().out)
    assert replayed["match"] and replayed["final_digest"] == digest[STEPS]
    assert main(["audit", fork, "check"]) == 0
    capsys.readouterr()
    assert main(["audit", out, "diff", fork, "--json"]) == 1
    diff = json.loads(capsys.readouterr().out)
    assert diff["fork_point"]["seq"] == forked.parent_seq and diff["fork_point"]["forked"] == ["b"]
    assert diff["fork_point"]["changes"]["b"] == {"trainer.learning_rate": [small_run_lr(out), 3e-3]}
    assert diff["first_divergent_version"]["version"] == 2  # the first step trained with the new rate

    again = str(tmp_path / "lr-same")  # a fork of the fork, at one of its own versions, changing nothing
    assert main(["fork", fork, "--at", "3", "--out", again, "--no-progress"]) == 0
    assert _summary(again)["final_digest"] == digest[STEPS]
    grand = [s.event for s in _stored(again) if isinstance(s.event, ev.RunForked)]
    assert [f.parent for f in grand] == [out, fork] and grand[1].config == forked.config
    capsys.readouterr()
    assert main(["replay", again, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["match"]


def small_run_lr(out) -> float:
    return _stored(out)[0].event.config["trainer"]["learning_rate"]


def _versions(stored) -> dict[int, str]:
    return {s.event.version: s.event.digest for s in stored if isinstance(s.event, ev.WeightsPublished)}


@pytest.mark.slow
def test_a_fork_at_the_final_version_with_more_steps_trains_on(parent, tmp_path):
    root, out = parent
    fork = tmp_path / "longer"
    assert main(["fork", out, "--at", str(STEPS), "--out", str(fork), "--no-progress", "--set", "run.steps=6"]) == 0
    summary = _summary(fork)
    assert (summary["final_version"], summary["steps"]) == (6, 6)
    assert _versions(_stored(fork))[STEPS] == _summary(out)["final_digest"]
    assert main(["ledger", "verify", str(fork)]) == 0


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "message"), [
    (["--at", "9"], "--at 9: run 'run' never published version 9 (it published 0..4)"),
    (["--at", "1", "--set", "trainer.nope=1"], "trainer field: 'nope' is not accepted; accepted: learning_rate"),
    (["--at", "1", "--set", "sampling.group_size=2"], "--set sampling.group_size=2: sampling.group_size cannot change "
                                                       "mid-run"),
    (["--at", "1", "--set", "run.steps=1"], "--set run.steps=1: the parent had already requested batch"),
])
def test_a_fork_that_cannot_be_is_refused_in_one_line_and_writes_nothing(parent, tmp_path, capsys, argv, message):
    root, out = parent
    fork = tmp_path / "refused"
    capsys.readouterr()
    assert main(["fork", out, "--out", str(fork), "--no-progress", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rlx: error: ") and message in err[0], err
    assert not fork.exists()


def test_a_fork_of_a_run_that_does_not_exist_is_refused(tmp_path, capsys):
    assert main(["fork", str(tmp_path / "nothing"), "--at", "1", "--out", str(tmp_path / "f")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"rlx: error: {str(tmp_path / 'nothing')!r} is not a run directory (a directory holding ledger.db); "
                   "give the directory of the run to fork"]
    assert not (tmp_path / "f").exists()


@pytest.mark.slow
def test_a_fork_at_a_version_the_parent_no_longer_keeps_is_refused(parent, tmp_path, capsys):
    import shutil

    from runtime.params import ParamStore

    root, out = parent
    copy = tmp_path / "parent"
    shutil.copytree(out, copy)
    ParamStore.open(str(copy / "params")).delete(1)  # as a retirement would have
    capsys.readouterr()
    assert main(["fork", str(copy), "--at", "2", "--out", str(tmp_path / "f")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"the parent's parameter store {copy / 'params'} no longer keeps version 1" in err[0]
    assert not (tmp_path / "f").exists()


@pytest.fixture(scope="module")
def clean(parent):
    """The parent's run with the right reward file from the start."""
    root, _ = parent
    return _run(root, root / "clean", "right.py")


@pytest.mark.slow
def test_a_rescored_replay_ends_on_the_weights_of_a_run_that_had_the_right_verifier_from_the_start(
        parent, clean, tmp_path, capsys):
    root, out = parent
    rescored = str(tmp_path / "rescored")
    right = str(root / "right.py")
    capsys.readouterr()
    assert main(["replay", out, "--rescore", right, "--out", rescored, "--no-progress", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["final_digest"] == _summary(clean)["final_digest"] != _summary(out)["final_digest"]
    forked = next(s for s in _stored(rescored) if isinstance(s.event, ev.RunForked))
    assert forked.event.reason == "rescore" and forked.event.changes["verifier.reward"] == (str(root / "buggy.py"),
                                                                                          f"{right}:reward")
    first = next(s for s in _stored(out) if isinstance(s.event, ev.OutcomeRecorded)
                 and s.event.rollout_id in _changed(out, right))
    assert forked.event.parent_seq == first.seq - 1  # just before the first outcome judged otherwise
    assert doc["first_tainted_version"] >= 1 and doc["version"] <= doc["first_tainted_version"] - 1
    assert main(["ledger", "verify", rescored]) == 0
    assert main(["replay", rescored]) == 0
    assert main(["audit", rescored, "taint", "--verifier", right, "--json"]) == 0  # nothing left to change
    capsys.readouterr()
    assert main(["replay", clean, "--rescore", right, "--out", str(tmp_path / "none")]) == 0
    assert "no outcome of run 'run' changes" in capsys.readouterr().out and not (tmp_path / "none").exists()


def _changed(out, verifier) -> set[int]:
    from runtime.audit.taint import taint_run

    return {c["rollout_id"] for c in taint_run(out, None, verifier, log=lambda m: None)["changed"]}


def test_rescore_and_out_go_together(tmp_path, capsys):
    assert main(["replay", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert main(["replay", str(tmp_path), "--rescore", "builtin"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["rlx: error: --rescore VERIFIER and --out DIR go together: the re-scored run is a new run "
                   "directory"] * 2
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
@pytest.mark.postgres
def test_a_fork_of_a_run_on_a_postgresql_ledger(parent, pg_url, tmp_path):
    import shutil

    from runtime.rundir import write_run_pointer

    root, out = parent
    with open_store(pg_url, create=True) as store:
        store.create_run("run")
        store.append("run", [s.event for s in _stored(out)], expected_seq=0, epoch=store.acquire_epoch("run"))
    moved = tmp_path / "pg_run"
    os.makedirs(moved)
    write_run_pointer(moved, pg_url, "run")
    shutil.copytree(os.path.join(out, "params"), moved / "params")
    fork = tmp_path / "fork"
    assert main(["fork", str(moved), "--at", "2", "--out", str(fork), "--no-progress"]) == 0
    assert _summary(fork)["final_digest"] == _summary(out)["final_digest"]
    assert main(["ledger", "verify", str(fork)]) == 0


def test_a_recorded_layout_read_back_as_tuples_is_the_same_machine():
    from runtime.replay import fingerprint_diff

    recorded = {"layout": {"trainer": (0,), "inference": ((0,),), "evaluator": ()}, "cores": 2}
    current = {"layout": {"trainer": [0], "inference": [[0]], "evaluator": []}, "cores": 2}
    assert fingerprint_diff(recorded, current) == {}
    assert fingerprint_diff(recorded, {**current, "cores": 4}) == {"cores": {"recorded": 2, "current": 4}}


@pytest.mark.slow
def test_a_fork_of_a_freshest_mode_run_replays_and_passes_the_audit(parent, tmp_path, capsys):
    root, _ = parent
    out = _run(root, tmp_path / "freshest", "right.py", "--set", 'scheduling.mode="freshest"')
    fork = str(tmp_path / "fork")
    assert main(["fork", out, "--at", "2", "--out", fork, "--no-progress", "--set", "trainer.learning_rate=3e-3"]) == 0
    assert _summary(fork)["final_version"] == STEPS
    capsys.readouterr()
    assert main(["replay", fork, "--json"]) == 0 and json.loads(capsys.readouterr().out)["match"]
    assert main(["audit", fork, "check"]) == 0 and main(["ledger", "verify", fork]) == 0
