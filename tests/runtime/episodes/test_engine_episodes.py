"""Episodes sampled by the real engine: each turn continues from the episode's ids, the row's
log-probs are the engine's, a re-issued episode regenerates the same turns, and a replay without
the tools re-derives it bit for bit."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from runtime.episodes import (
    Calculator,
    EnginePolicy,
    Parsed,
    PlainTurns,
    TagRule,
    ToolEnvironment,
    ToolTask,
    replay_episode,
    run_episode,
    turn_seed,
)
from runtime.inference import Engine, SamplingParams
from runtime.model import Model, ModelConfig
from runtime.tasks import Arithmetic
from tests.runtime.episodes.scripted import NoTool

MAX_CALLS = 3


@dataclasses.dataclass(frozen=True)
class EveryActionCalls(TagRule):
    """Reads every action as a calculator call of its text, so that an untrained model's random
    text makes multi-turn episodes (its calls come back as calculator errors)."""

    name: str = "every-action"

    def parse(self, text: str) -> Parsed:
        return Parsed(True, "calculator", text)



@pytest.fixture(scope="module")
def engine(plain_codec):
    vocab = plain_codec.tokenizer.get_vocab_size()
    config = ModelConfig(vocab_size=vocab, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                         intermediate_size=64, rope_theta=1000.0, max_position_embeddings=512, eos_token_id=2)
    model = Model.init(config, key=jax.random.key(0))
    return Engine(model, max_slots=2, page_size=8, num_pages=2 * 40 + 1, max_seq_len=320,
                  prefill_buckets=(64, 128, 256, 312))


def _env(plain_codec, tools):
    task = ToolTask(Arithmetic(digits=2, eval_size=10), TagRule(), ("calculator",), chat=False)
    return ToolEnvironment(task, PlainTurns(plain_codec), EveryActionCalls(), tools, max_calls=MAX_CALLS)


def test_engine_episodes_continue_from_their_ids_and_replay_without_tools(plain_codec, engine):
    params = SamplingParams(temperature=1.0, max_tokens=8)
    env = _env(plain_codec, {"calculator": Calculator()})
    problem = env.task.problem("train", 5)
    episode = run_episode(env, problem, EnginePolicy(engine, params, seed=11))
    assert len(episode.turns) == MAX_CALLS + 1 and len(episode.calls) == MAX_CALLS
    # each turn is what the engine samples from the ids before it, with its seed
    for k, turn in enumerate(episode.turns):
        before = episode.row().ids[: episode.prompt.size + sum(t.sampled.size + t.appended.size for t in episode.turns[:k])]
        (again,) = engine.generate([before], params, [turn_seed(11, k)])
        assert again.tokens.tolist() == turn.sampled.tolist()
        assert again.logprobs.tobytes() == turn.logprobs.tobytes()
    row = episode.row()
    assert row.logprobs[row.mask].tobytes() == np.concatenate([t.logprobs for t in episode.turns]).tobytes()
    # re-issued with the same seed (another policy object, another batch): the same episode
    assert run_episode(_env(plain_codec, {"calculator": Calculator()}), problem,
                       EnginePolicy(engine, params, seed=11)) == episode
    assert run_episode(env, problem, EnginePolicy(engine, params, seed=12)) != episode
    # no tool runs in a replay, and it is bit-exact
    assert replay_episode(_env(plain_codec, {"calculator": NoTool()}), problem, episode) == episode
