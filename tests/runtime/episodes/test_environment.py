"""Episodes through the tool environment: calls, malformed calls and hostile code are recorded
outcomes; the row is the recorded ids; a replay needs no tool; a non-deterministic tool is named."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.episodes import (
    Calculator,
    Episode,
    EpisodeDivergence,
    EpisodeError,
    FenceRule,
    PythonTool,
    Status,
    StepKind,
    TagRule,
    ToolEnvironment,
    ToolResult,
    Turn,
    check_tools,
    replay_environment,
    replay_episode,
    run_episode,
    tool_environment,
)
from runtime.tasks import Arithmetic
from tests.runtime.episodes.scripted import NoTool, Scripted
from verifiers.code import Limits

TASK = Arithmetic(digits=2, eval_size=10)
INDEX = 1234  # a training problem of the 2-digit sums; its answer fixes the final turns below
PROBLEM = TASK.problem("train", INDEX)
A, B = (int(x) for x in PROBLEM.prompt.rstrip("=").split("+"))



class Clock:
    """Not deterministic: answers with a counter that moves on every call."""

    name = "calculator"

    def __init__(self):
        self.calls = 0

    def describe(self) -> dict:
        return {"name": self.name}

    def run(self, arguments: str) -> ToolResult:
        self.calls += 1
        return ToolResult.of(str(self.calls).encode(), 0, 0.0, Status.OK)


def _env(codec, **kw):
    return tool_environment(TASK, codec, **kw)


@pytest.fixture(params=["plain", "chat"])
def codec(request):
    return request.getfixturevalue(f"{request.param}_codec")


def _play(codec, texts, **kw):
    env = _env(codec, **kw)
    return env, run_episode(env, env.task.problem("train", INDEX), Scripted(codec, texts))


def test_a_call_then_the_answer(codec):
    env, episode = _play(codec, [f"<tool>calculator: {A}+{B}</tool>", str(A + B)])
    assert episode.reward == 1.0 and len(episode.turns) == 2
    (call,) = episode.calls
    assert (call.tool, call.arguments, call.result.output) == ("calculator", f"{A}+{B}", str(A + B).encode())
    assert episode.turns[1].appended.size == 0  # nothing follows the final answer


def test_each_turn_continues_from_the_episodes_ids(codec):
    env = _env(codec)
    policy = Scripted(codec, ["<tool>calculator: 1+1</tool>", "<tool>calculator: 2+2</tool>", "-1"])
    episode = run_episode(env, env.task.problem("train", INDEX), policy)
    assert [c.tolist() for c in policy.contexts] == [
        episode.prompt.tolist(),
        np.concatenate([episode.prompt, episode.turns[0].sampled, episode.turns[0].appended]).tolist(),
        np.concatenate([episode.prompt, *(x for t in episode.turns[:2] for x in (t.sampled, t.appended))]).tolist(),
    ]
    assert episode.reward == 0.0


def test_malformed_and_unknown_calls_are_recorded_and_the_episode_goes_on(codec):
    env, episode = _play(codec, ["<tool>calculator 1+1</tool>", "<tool>abacus: 1+1</tool>", str(A + B)])
    malformed, unknown = episode.calls
    assert malformed.result.status is Status.MALFORMED and "no ':'" in malformed.result.detail
    assert unknown.result.status is Status.UNKNOWN_TOOL and "no tool 'abacus'; tools: calculator" in unknown.result.detail
    assert episode.reward == 1.0


def test_the_call_limit_ends_the_episode(codec):
    env, episode = _play(codec, ["<tool>calculator: 1</tool>"] * 3, max_calls=2)
    assert len(episode.calls) == 2 and len(episode.turns) == 3 and episode.reward == 0.0


def test_describe_names_the_rule_and_the_tools_limits(plain_codec, sandbox):
    env = _env(plain_codec, tools={"calculator": Calculator(max_digits=9), "python": PythonTool(sandbox)})
    described = env.describe()
    assert described["rule"]["rule"] == "tag" and described["rule_digest"] == TagRule().digest
    assert described["tools"]["calculator"]["max_digits"] == 9
    assert described["tools"]["python"]["limits"]["wall_s"] == 5.0
    assert replay_environment(env, Episode([1])).describe() == described


def test_step_before_reset_is_an_error(plain_codec):
    with pytest.raises(EpisodeError, match="step before reset"):
        _env(plain_codec).step([5])
    with pytest.raises(EpisodeError, match="did not end within 2 turns"):
        run_episode(_env(plain_codec), PROBLEM, Scripted(plain_codec, ["<tool>calculator: 1</tool>"] * 3), max_turns=2)


def test_replay_needs_no_tool_and_is_bit_exact(codec):
    env, episode = _play(codec, [f"<tool>calculator: {A}+{B}</tool>", "<tool>x</tool>", "<tool>calculator: 2**9999</tool>",
                                 str(A + B)])
    offline = ToolEnvironment(env.task, env.turns, env.rule, {"calculator": NoTool()}, max_calls=env.max_calls)
    replayed = replay_episode(offline, env.task.problem("train", INDEX), episode)
    assert replayed == episode
    assert replayed.row().ids.tobytes() == episode.row().ids.tobytes()
    assert replayed.row().logprobs.tobytes() == episode.row().logprobs.tobytes()


def test_a_tampered_record_is_a_divergence(codec):
    env, episode = _play(codec, [f"<tool>calculator: {A}+{B}</tool>", str(A + B)])
    problem = env.task.problem("train", INDEX)
    first = episode.turns[0]
    assert first.call is not None
    forged = dataclasses.replace(first.call, result=dataclasses.replace(first.call.result, output=b"7"))
    bad = Episode(episode.prompt, (dataclasses.replace(first, call=forged), episode.turns[1]), episode.reward)
    with pytest.raises(EpisodeDivergence, match="turn 1: the appended ids differ"):
        replay_episode(env, problem, bad)
    other_call = Scripted(codec, ["<tool>calculator: 1+1</tool>"]).actions[0]
    bad = Episode(episode.prompt, (dataclasses.replace(first, sampled=other_call, logprobs=np.zeros(len(other_call))),
                                   episode.turns[1]), episode.reward)
    with pytest.raises(EpisodeDivergence, match=r"tool call 1: the record has calculator"):
        replay_episode(env, problem, bad)
    with pytest.raises(EpisodeDivergence, match="reward"):
        replay_episode(env, problem, Episode(episode.prompt, episode.turns, 0.5))


def test_check_tools_names_a_tool_that_is_not_deterministic(plain_codec):
    texts = ["<tool>calculator: 2+2</tool>", "<tool>calculator: 2+2</tool>", "4"]
    env, episode = _play(plain_codec, texts, tools={"calculator": Calculator()})
    assert check_tools(episode, {"calculator": Calculator()}) == []
    clock = Clock()
    env, episode = _play(plain_codec, texts, tools={"calculator": clock})
    found = check_tools(episode, {"calculator": clock})
    assert [(d.call, d.tool, d.fields) for d in found] == [(1, "calculator", ("output",)), (2, "calculator", ("output",))]
    assert found[0].describe() == "tool 'calculator' is not deterministic: call 1 gave another output than the record"


def test_hostile_code_is_cut_and_the_episode_goes_on(chat_codec, sandbox):
    python = PythonTool(sandbox, Limits(wall_s=3.0, cpu_s=1.0, output_bytes=1 << 16))
    texts = ["```python\nwhile True:\n    pass\n```", "```python\nprint('y' * (1 << 20))\n```",
             f"```python\nprint({A}+{B})\n```", str(A + B)]
    env, episode = _play(chat_codec, texts, tools={"python": python}, rule=FenceRule())
    assert [c.result.status for c in episode.calls] == [Status.TIME_LIMIT, Status.OUTPUT_LIMIT, Status.OK]
    assert episode.calls[2].result.output == f"{A + B}\n".encode()
    assert episode.reward == 1.0
    # the python tool is deterministic here: running the calls again gives the record
    assert check_tools(dataclasses.replace(episode, turns=episode.turns[2:]), {"python": python}) == []


FRAGMENTS = st.sampled_from(["<tool>", "</tool>", "calculator", "python", ":", " ", "1", "2*3", "/0", "**99", "x", "\n",
                             "<|im_end|>", "<|im_start|>", "assistant", "<eos>", "<result>"])


@settings(max_examples=60)
@given(st.lists(st.tuples(st.lists(FRAGMENTS, max_size=8), st.booleans()), min_size=1, max_size=5),
       st.sampled_from(["plain", "chat"]))
def test_every_row_is_its_recorded_ids_and_masks_the_models_tokens(plain_codec, chat_codec, actions, which):
    codec = plain_codec if which == "plain" else chat_codec
    env = _env(codec, max_calls=len(actions))
    problem = env.task.problem("train", INDEX)
    episode = Episode(env.reset(problem))
    for fragments, stop in actions:
        sampled = codec.tokenizer.encode("".join(fragments), add_special_tokens=False).ids + ([codec.eos_ids[0]] * stop)
        result = env.step(sampled)
        episode = episode.add(Turn(sampled, np.full(len(sampled), -0.25, np.float32), result.ids, result.call))
        assert (result.kind is StepKind.FINAL) == result.done
        if result.done:
            episode = episode.finish(result.reward)
            break
    row = episode.row()
    recorded = [episode.prompt.tolist()] + [part for t in episode.turns for part in (t.sampled.tolist(), t.appended.tolist())]
    assert row.ids.tolist() == [i for part in recorded for i in part]
    assert row.mask.tolist() == [False] * episode.prompt.size + [m for t in episode.turns
                                                                 for m in [True] * t.sampled.size + [False] * t.appended.size]
    if episode.done:
        assert replay_episode(env, problem, episode) == episode
