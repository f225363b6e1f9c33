"""Episodes sampled by the real engine: each turn continues from the episode's ids, the row's
log-probs are the engine's, a re-issued episode regenerates the same turns, a batch sampled with
the episodes' KV pages kept between turns (or preempted by a small pool) has the bits of each
episode alone, and a replay without the tools re-derives it bit for bit."""

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



SHAPE = dict(max_slots=2, page_size=8, max_seq_len=320, prefill_buckets=(64, 128, 256, 312))
ROOMY = 2 * 40 + 1  # pages: each slot's longest sequence


@pytest.fixture(scope="module")
def model(plain_codec):
    vocab = plain_codec.tokenizer.get_vocab_size()
    config = ModelConfig(vocab_size=vocab, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                         intermediate_size=64, rope_theta=1000.0, max_position_embeddings=512, eos_token_id=2)
    return Model.init(config, key=jax.random.key(0))


@pytest.fixture(scope="module")
def engine(model):
    return Engine(model, num_pages=ROOMY, **SHAPE)


def _env(plain_codec, tools):
    task = ToolTask(Arithmetic(digits=2, eval_size=10), TagRule(), ("calculator",), chat=False)
    return ToolEnvironment(task, PlainTurns(plain_codec), EveryActionCalls(), tools, max_calls=MAX_CALLS)


def test_engine_episodes_continue_from_their_ids_and_replay_without_tools(plain_codec, engine):
    params = SamplingParams(temperature=1.0, max_tokens=8)
    env = _env(plain_codec, {"calculator": Calculator()})
    problem = env.task.problem("train", 5)
    prompt_len = env.reset(problem).size
    episode = run_episode(env, problem, EnginePolicy(engine, params, 11, prompt_len))
    assert len(episode.turns) == MAX_CALLS + 1 and len(episode.calls) == MAX_CALLS
    # each turn is what the engine samples after the prompt and the ids fed after it, with its seed
    for k, turn in enumerate(episode.turns):
        before = episode.row().ids[: episode.prompt.size + sum(t.sampled.size + t.appended.size for t in episode.turns[:k])]
        (again,) = engine.generate([before[:prompt_len]], params, [turn_seed(11, k)], feeds=[before[prompt_len:]])
        assert again.tokens.tolist() == turn.sampled.tolist()
        assert again.logprobs.tobytes() == turn.logprobs.tobytes()
    row = episode.row()
    assert row.logprobs[row.mask].tobytes() == np.concatenate([t.logprobs for t in episode.turns]).tobytes()
    # re-issued with the same seed (another policy object, another batch): the same episode
    assert run_episode(_env(plain_codec, {"calculator": Calculator()}), problem,
                       EnginePolicy(engine, params, 11, prompt_len)) == episode
    assert run_episode(env, problem, EnginePolicy(engine, params, 12, prompt_len)) != episode
    # no tool runs in a replay, and it is bit-exact
    assert replay_episode(_env(plain_codec, {"calculator": NoTool()}), problem, episode) == episode


@pytest.mark.parametrize("pages", [ROOMY, 45], ids=["kept", "preempted"])
def test_a_batch_with_pages_kept_between_turns_has_each_episodes_bits_alone(plain_codec, model, engine, pages):
    """The sampler keeps each episode's pages between turns (with 45 pages of 8 ids for 2 slots
    the younger episode is preempted and recomputed): each episode equals the one its own policy
    samples alone, turn by turn (``EnginePolicy``, which feeds the ids after the prompt)."""
    from runtime.episodes.rollout import EpisodeSampler

    sampler_engine = engine if pages == ROOMY else Engine(model, num_pages=pages, **SHAPE)
    turn_tokens, budget = 8, 260
    problems = [_env(plain_codec, {}).task.problem("train", i) for i in range(5)]
    params = [SamplingParams(temperature=1.0, max_tokens=budget)] * len(problems)
    seeds = [21 + i for i in range(len(problems))]
    sampled = EpisodeSampler(sampler_engine, lambda: _env(plain_codec, {"calculator": Calculator()}),
                             turn_tokens=turn_tokens).generate(problems, params, seeds)
    stats = sampler_engine.last_stats
    assert stats.turns == sum(len(e.turns) for e in sampled) > len(problems)
    if pages != ROOMY:
        assert stats.preemptions > 0, stats
    for problem, seed, e in zip(problems, seeds, sampled, strict=True):
        env = _env(plain_codec, {"calculator": Calculator()})
        prompt_len = env.reset(problem).size
        alone = []
        used = 0
        for k, turn in enumerate(e.episode.turns):  # the policy alone, each turn's budget as the sampler's
            turn_params = SamplingParams(temperature=1.0, max_tokens=min(turn_tokens, budget - used))
            ids, logprobs = EnginePolicy(engine, turn_params, seed, prompt_len)(e.episode.context()[
                : prompt_len + used], k)
            alone.append((ids.tolist(), logprobs.tobytes()))
            used += turn.sampled.size + turn.appended.size
        assert alone == [(t.sampled.tolist(), t.logprobs.tobytes()) for t in e.episode.turns]

