"""A run scored by the user's own reward function (``verifier.reward``): the function runs in the
verifier worker's sandbox and its numbers are the rewards the ledger records; the file's sha256 is
in the run's config and inputs, and a resume or replay after it changed is refused in one line
naming it. A reward file that does not work is refused before anything is created."""

from __future__ import annotations

import hashlib
import shutil

import pytest

from ledger import open_store
from runtime.cli import main
from runtime.errors import UsageError
from tests.runtime import small_run

REWARD = '''
def reward(prompt, completion, answer):
    """An eighth of a point per character, and 2 more for the right sum."""
    return len(completion) / 8 + (2.0 if completion.strip() == answer else 0.0)
'''


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _argv(tmp_path, out, *extra: str) -> list[str]:
    argv = ["run", "--out", str(out), "--no-progress", "--steps", "2", "--data", str(tmp_path / "sums.jsonl"),
            "--set", f'pretrain.cache_dir="{tmp_path / "warm"}"', "--set", "sampling.max_tokens=4"]
    for o in [*small_run.TINY, *extra]:
        argv += ["--set", o]
    return argv


@pytest.fixture(scope="module")
def rewarded(tmp_path_factory):
    root = tmp_path_factory.mktemp("reward")
    small_run.write_sums(root / "sums.jsonl")
    (root / "my_reward.py").write_text(REWARD, encoding="utf-8")
    out = root / "run"
    assert main(_argv(root, out, f'verifier.reward="{root / "my_reward.py"}"')) == 0
    return root, out


@pytest.mark.slow
def test_the_users_function_scores_every_completion_in_the_verifier_worker(rewarded):
    from runtime.tasks.base import TextCodec

    root, out = rewarded
    with open_store(out, readonly=True) as store:
        events = [s.event for s in store.read("run")]
    started = events[0]
    path, digest = str(root / "my_reward.py"), _sha(REWARD)
    assert started.config["verifier"]["reward"] == path and started.config["verifier"]["reward_digest"] == digest
    assert started.fingerprint["inputs"]["reward"] == {"path": path, "files": {"my_reward.py": digest}}
    completions = {e.rollout_id: TextCodec.builtin().decode(e.tokens) for e in events
                   if e.KIND == "RolloutCompleted"}
    outcomes = [e for e in events if e.KIND == "OutcomeRecorded"]
    assert outcomes and {(o.verifier, o.verifier_version) for o in outcomes} == {("reward", f"sha256:{digest}")}
    for o in outcomes:  # the reward is the function's, recomputed here from the completion's text
        bonus = o.reward - len(completions[o.rollout_id]) / 8
        assert bonus in (0.0, 2.0) and o.passed == (bonus == 2.0) and o.verdict == ("AC" if o.passed else "WA"), o
    assert {o.reward for o in outcomes} != {0.0, 1.0}  # not the math verifier's 0/1


@pytest.mark.slow
def test_a_changed_reward_file_is_refused_on_resume_and_replay(rewarded, tmp_path, capsys):
    from runtime.replay import replay_run

    root, out = rewarded
    moved = tmp_path / "run"
    shutil.copytree(out, moved)
    module = root / "my_reward.py"
    try:
        module.write_text(REWARD + "\n# edited\n", encoding="utf-8")
        assert main(["resume", str(moved), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"rlx: error: cannot resume: input file {str(module)!r} has changed since the run read it "
                       f"(sha256 {_sha(REWARD + chr(10) + '# edited' + chr(10))}, the run recorded {_sha(REWARD)}); "
                       "restore it to resume"]
        with pytest.raises(UsageError, match=f"cannot replay: input file '{module}' has changed since the run read it"):
            replay_run(str(moved))
    finally:
        module.write_text(REWARD, encoding="utf-8")
    assert replay_run(str(moved)).match


def test_a_worker_loading_a_changed_file_is_refused(tmp_path):
    """What a verifier worker does with the run's logged config: the file's digest must match."""
    from runtime.config import load_config
    from runtime.session import build_task

    small_run.write_sums(tmp_path / "sums.jsonl")
    module = tmp_path / "my_reward.py"
    module.write_text(REWARD, encoding="utf-8")
    sets = [f'data.path="{tmp_path / "sums.jsonl"}"', 'data.task="jsonl"', f'verifier.reward="{module}:reward"']
    task, sandbox = build_task(load_config(None, [*sets, f'verifier.reward_digest="{_sha(REWARD)}"']), log=lambda m: None)
    assert "isolation" in sandbox and task.reward(task.score([task.problem("train", 0)], ["9"])[0]) == 1 / 8
    module.write_text(REWARD.replace("2.0", "3.0"), encoding="utf-8")
    with pytest.raises(UsageError) as info:
        build_task(load_config(None, [*sets, f'verifier.reward_digest="{_sha(REWARD)}"']), log=lambda m: None)
    assert str(info.value) == (f"verifier.reward: {module} has changed since the run started (sha256 "
                               f"{_sha(REWARD.replace('2.0', '3.0'))}, the run recorded {_sha(REWARD)} in "
                               "verifier.reward_digest); restore it")


@pytest.mark.parametrize("source, spec, message", [
    (None, "nowhere.py", "nowhere.py does not exist"),
    ("def score(p, c, a):\n    return 1\n", "r.py", "defines no function 'reward' at its top level"),
    ("def reward(p, c, a):\n    return 'high'\n", "r.py", "reward returned 'high' (str); it must return a finite number"),
    ("def reward(p, c, a):\n    return 1 / 0\n", "r.py", "reward raised ZeroDivisionError"),
])
def test_a_reward_file_that_does_not_work_is_refused_before_the_run(tmp_path, capsys, source, spec, message):
    small_run.write_sums(tmp_path / "sums.jsonl")
    if source is not None:
        (tmp_path / "r.py").write_text(source, encoding="utf-8")
    out = tmp_path / "run"
    assert main(_argv(tmp_path, out, 'workers.mode="threads"', f'verifier.reward="{tmp_path / spec}"')) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rlx: error: verifier.reward ") and message in err, err
    assert not out.exists()


def test_the_example_reward_with_the_example_config():
    """configs/example_reward.py, named in configs/example.toml, loads, passes its probe call and
    gives its documented rewards."""
    import pathlib

    from runtime.config import load_config
    from runtime.session import build_task, make_task, resolve

    root = pathlib.Path(__file__).resolve().parents[2]
    spec = str(root / "configs" / "example_reward.py")
    config = load_config(root / "configs" / "example.toml", ["run.steps=2", f'verifier.reward="{spec}"'])
    task, _ = build_task(config, log=lambda m: None)
    problem = task.problem("train", 0)
    outcomes = task.score([problem] * 3, [problem.answer, f"so it is {problem.answer}", "x"])
    assert [task.reward(o) for o in outcomes] == [1.0, 0.5, 0.0] and [o.passed for o in outcomes] == [True, False, False]
    digest = hashlib.sha256((root / "configs" / "example_reward.py").read_bytes()).hexdigest()
    assert resolve(config, task).verifier.reward_digest == digest
    assert task.describe() == make_task(config).describe()  # the same problems: the same cached warm start


def test_a_relative_reward_file_is_recorded_and_located_by_absolute_path(tmp_path, monkeypatch):
    """As for data files: the config keeps the name as typed, the run's inputs its absolute path,
    and a resume or replay from another directory builds from that path, function name kept."""
    import dataclasses

    from runtime import inputs
    from runtime.config import Config

    (tmp_path / "r.py").write_text(REWARD.replace("def reward", "def score"), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    config = Config.from_dict({"verifier": {"reward": "r.py:score"}})
    recorded = inputs.record(config)
    digest = _sha(REWARD.replace("def reward", "def score"))
    assert recorded == {"reward": {"path": str(tmp_path / "r.py"), "files": {"r.py": digest}}}
    monkeypatch.chdir(tmp_path.parent)
    located = inputs.located(config, {"inputs": recorded})
    assert located.verifier.reward == f"{tmp_path / 'r.py'}:score" and config.verifier.reward == "r.py:score"
    assert inputs.check(located, {"inputs": recorded}, what="resume", warn=print) == recorded
    gone = dataclasses.replace(located, verifier=dataclasses.replace(located.verifier, reward=None))
    with pytest.raises(UsageError, match=f"cannot resume: the run read reward from '{tmp_path / 'r.py'}', which"):
        inputs.check(gone, {"inputs": recorded}, what="resume", warn=print)
