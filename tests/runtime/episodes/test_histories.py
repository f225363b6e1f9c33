"""Committed episode histories replay without any tool, bit for bit; a known-bad one diverges.

The histories were written by ``write_histories()`` below (run it again only on purpose: a change
to the turn format, the rule or the calculator that alters them is a change of recorded behaviour).
"""

from __future__ import annotations

import json
import pathlib

import pytest

from runtime.episodes import (
    EpisodeDivergence,
    EpisodeError,
    FenceRule,
    TagRule,
    ToolEnvironment,
    episode_from_record,
    episode_record,
    replay_episode,
    run_episode,
    tool_environment,
)
from runtime.tasks import Arithmetic
from tests.runtime.episodes.conftest import chatml_codec
from tests.runtime.episodes.scripted import NoTool, Scripted

HERE = pathlib.Path(__file__).parent / "histories"
TASK = Arithmetic(digits=2, eval_size=10)
INDEX = 1234  # 12+35=
TEXTS = ["<tool>calculator: 12+35</tool>", "<tool>calculator 1</tool>", "<tool>calculator: 10**999</tool>", "47"]



def _codec(which: str):
    from runtime.tasks.base import TextCodec

    return TextCodec.builtin() if which == "plain" else chatml_codec()


def _offline(which: str) -> ToolEnvironment:
    env = tool_environment(TASK, _codec(which))
    return ToolEnvironment(env.task, env.turns, env.rule, {"calculator": NoTool()}, max_calls=env.max_calls)


def _dump(record: dict) -> str:
    """JSON with one line per field and per turn (reviewable diffs)."""
    fields = [f"  {json.dumps(k)}: " + ("[\n" + ",\n".join(f"    {json.dumps(t)}" for t in v) + "\n  ]" if k == "turns"
                                        else json.dumps(v)) for k, v in record.items()]
    return "{\n" + ",\n".join(fields) + "\n}\n"


def write_histories() -> None:
    """Record the committed histories (the good ones and the known-bad one)."""
    HERE.mkdir(exist_ok=True)
    for which in ("plain", "chat"):
        codec = _codec(which)
        env = tool_environment(TASK, codec)
        episode = run_episode(env, env.task.problem("train", INDEX), Scripted(codec, TEXTS))
        record = episode_record(episode, env.rule)
        for turn in record["turns"]:
            if "call" in turn:
                turn["call"]["result"]["wall_s"] = 0.0  # a measurement: kept out of the committed bytes
        (HERE / f"{which}_calculator.json").write_text(_dump(record))
        if which == "plain":
            record["turns"][0]["call"]["result"]["output"] = b"48".hex()  # a forged tool result
            (HERE / "bad_plain_forged_result.json").write_text(_dump(record))


def _load(name: str) -> dict:
    return json.loads((HERE / name).read_text())


@pytest.mark.parametrize("which", ["plain", "chat"])
def test_committed_history_replays_without_tools(which):
    record = _load(f"{which}_calculator.json")
    env = _offline(which)
    episode = episode_from_record(record, env.rule)
    assert episode_record(episode, env.rule) == record  # the record is exact both ways
    assert replay_episode(env, env.task.problem("train", INDEX), episode) == episode
    assert [c.result.status.value for c in episode.calls] == ["ok", "malformed", "error"]
    assert episode.reward == 1.0


def test_known_bad_history_diverges():
    env = _offline("plain")
    episode = episode_from_record(_load("bad_plain_forged_result.json"), env.rule)
    with pytest.raises(EpisodeDivergence, match="turn 1: the appended ids differ from the record"):
        replay_episode(env, env.task.problem("train", INDEX), episode)


def test_a_record_of_another_rule_is_refused():
    with pytest.raises(EpisodeError, match="recorded with tool-call rule 'tag'.*not 'fence'"):
        episode_from_record(_load("plain_calculator.json"), FenceRule())
    with pytest.raises(EpisodeError, match="version 0 is not accepted"):
        episode_from_record({**_load("plain_calculator.json"), "version": 0}, TagRule())
