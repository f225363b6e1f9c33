"""``rlx run`` with tools: every rollout a multi-turn episode whose turns and tool calls are in the
ledger. Every trained row is exactly the recorded ids with the model's ids masked in; the run
replays bit for bit with no tool able to run; its audit is clean; SIGKILLed twice and resumed it
ends on the uninterrupted digest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from ledger import events as ev
from ledger import open_store
from runtime.config import load_config
from runtime.episodes import Calculator, PythonTool
from runtime.run import run
from tests.runtime import small_run

STEPS = 4
TOOLS = [
    'workers.mode="threads"', *small_run.TINY, "model.hidden_size=64", "model.num_layers=2", "model.num_heads=4",
    "model.num_kv_heads=2", "model.intermediate_size=128", "pretrain.steps=300", "pretrain.batch_size=32",
    "pretrain.learning_rate=3e-3", 'episodes.tools=["calculator"]', "episodes.turn_tokens=40",
    "sampling.max_tokens=64", "eval.size=8", "scheduling.groups_per_batch=2", "trainer.learning_rate=1e-3",
]
"""A tiny model on the built-in sums with a calculator: its warm start is worked episodes (a call,
the result, the answer), so its rollouts call the tool."""


def tools_config(cache_dir: str, *extra: str):
    return load_config(None, [*TOOLS, f'pretrain.cache_dir="{cache_dir}"', f"run.steps={STEPS}", *extra])


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("warm_start"))


@pytest.fixture(scope="module")
def tool_run(tmp_path_factory, cache_dir):
    out = str(tmp_path_factory.mktemp("tools") / "run")
    summary = run(tools_config(cache_dir), out, progress=False, log=lambda m: None)
    return out, summary


def _stored(out: str) -> list:
    with open_store(out) as store:
        return list(store.read("run"))


def _events(out: str) -> list[ev.Event]:
    return [s.event for s in _stored(out)]


@pytest.mark.slow
def test_every_trained_row_is_the_recorded_ids_with_only_the_models_ids_trained(tool_run):
    from runtime.episodes.check import check_rows

    out, _ = tool_run
    completions = [e for e in _events(out) if type(e) is ev.RolloutCompleted]
    assert completions and all(c.turns for c in completions)
    calls = [t["call"] for c in completions for t in c.turns if t["call"] is not None]
    assert any(call["tool"] == "calculator" and call["status"] == "ok" for call in calls), \
        "the warm-started model made no calculator call that ran"
    with open_store(out) as store:
        found = check_rows(store, "run")
    assert found.first_difference is None
    assert found.rows == found.equal == STEPS * 2 * 4 and found.calls > 0 and found.turns > found.rows


@pytest.mark.slow
def test_a_row_that_is_not_its_record_is_found(tool_run, monkeypatch):
    """The check can fail: a trainer that also trained the environment's ids is named."""
    from runtime.episodes import check
    from runtime.workers import trainer

    out, _ = tool_run
    monkeypatch.setattr(trainer, "completion_mask", lambda turns, n: np.ones(n, bool))
    with open_store(out) as store:
        found = check.check_rows(store, "run")
    assert found.equal < found.rows and "its mask is not the model's ids" in found.first_difference


@pytest.mark.slow
def test_the_run_replays_bit_exactly_with_no_tool_able_to_run_and_its_audit_is_clean(tool_run, monkeypatch, capsys):
    from runtime.audit import check_run
    from runtime.cli import main
    from runtime.params import ParamStore
    from runtime.replay import replay_run

    out, summary = tool_run

    def unavailable(self, arguments):
        raise AssertionError("a replay ran a tool")

    monkeypatch.setattr(Calculator, "run", unavailable)
    monkeypatch.setattr(PythonTool, "run", unavailable)
    report = replay_run(out)
    assert report.match and report.first_divergence is None
    assert report.final_digest == summary["final_digest"] and report.versions_verified == STEPS + 1
    assert report.episodes_rederived == STEPS * 2 * 4  # every trained episode, from its recorded tool results
    pstore = ParamStore.open(os.path.join(out, "params"))
    assert check_run(_stored(out), stored={v: pstore.verify(v) for v in pstore.versions()}) == []
    # the audit shows an episode turn by turn
    assert main(["audit", out, "rollout", "0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["rollout"]
    assert doc["turns"] and doc["turns"][0]["sampled"] >= 1
    assert sum(t["sampled"] + t["appended"] for t in doc["turns"]) == doc["tokens"]


@pytest.mark.slow
def test_a_recorded_tool_result_that_was_altered_is_named_by_the_replay(tool_run, tmp_path):
    """Re-deriving an episode whose recorded calculator output was changed: the appended ids no
    longer follow from the record, and the replay names the rollout and the turn."""
    from runtime.config import Config
    from runtime.episodes import EpisodeDivergence
    from runtime.episodes.rollout import rederive
    from runtime.session import build_session

    out, _ = tool_run
    events = _events(out)
    config = Config.from_dict(next(e for e in events if type(e) is ev.RunStarted).config)
    session = build_session(config, log=lambda m: None, warm=False, engine=False, judge=False)
    requests = {rid: q for e in events if type(e) is ev.RolloutRequested for rid, q in
                zip(e.rollout_ids, e.samples(), strict=True)}
    c = next(c for c in events if type(c) is ev.RolloutCompleted
             and any(t["call"] is not None and t["call"]["status"] == "ok" for t in c.turns))
    k = next(i for i, t in enumerate(c.turns) if t["call"] is not None and t["call"]["status"] == "ok")
    turns = list(c.turns)
    turns[k] = {**turns[k], "call": {**turns[k]["call"], "output": turns[k]["call"]["output"] + b"0"}}
    problem = session.task.problem("train", requests[c.rollout_id].prompt_index)
    env = session.task.environment(session.codec, tools={})
    with pytest.raises(EpisodeDivergence, match=f"turn {k + 1}"):
        rederive(env, problem, session.codec.encode_prompt(problem), c.tokens, c.logprobs, tuple(turns),
                 config.max_tokens)


@pytest.mark.slow
def test_a_tool_run_killed_twice_and_resumed_ends_on_the_uninterrupted_digest(tool_run, tmp_path, cache_dir):
    from runtime.audit import check_run
    from runtime.params import ParamStore

    _, reference = tool_run
    out = str(tmp_path / "killed")
    first = [sys.executable, "-m", "runtime.cli", "run", "--out", out, "--no-progress"]
    for o in [*TOOLS, f'pretrain.cache_dir="{cache_dir}"', f"run.steps={STEPS}"]:
        first += ["--set", o]
    again = [sys.executable, "-m", "runtime.cli", "resume", out, "--no-progress"]
    for argv, point in ((first, "inference.generate@2"), (again, "trainer.step@2")):
        proc = subprocess.run(argv, env={**os.environ, "RLX_FAILPOINTS": point, "RLX_TEST_FAILPOINTS": "1"},
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == -signal.SIGKILL, (point, proc.returncode, proc.stderr[-2000:])
    done = subprocess.run(again, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    with open(os.path.join(out, "summary.json")) as f:
        assert json.load(f)["final_digest"] == reference["final_digest"]
    pstore = ParamStore.open(os.path.join(out, "params"))
    assert check_run(_stored(out), stored={v: pstore.verify(v) for v in pstore.versions()}) == []


@pytest.mark.slow
def test_regenerating_reruns_the_tools_and_names_one_that_answers_otherwise(tool_run, monkeypatch):
    from runtime.episodes import Status, ToolResult
    from runtime.replay import replay_run

    out, summary = tool_run
    report = replay_run(out, regenerate=True)
    assert report.match and report.rollouts_regenerated == STEPS * 2 * 4

    def drifting(self, arguments):  # a calculator that reads something other than its arguments
        return ToolResult.of(b"41", 0, 0.001, Status.OK)

    monkeypatch.setattr(Calculator, "run", drifting)
    report = replay_run(out, regenerate=True)
    first = report.first_divergence
    assert not report.match and first.field == "turns" and first.stage == "rollout"
    assert "tool 'calculator' is not deterministic" in first.message and "output" in first.message
