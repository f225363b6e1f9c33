"""A group's shared prompt computed once: attention, forward, the train step and the config.

The rows of a group continue one prompt, so the whole-batch step computes the prompt once per
group and the rest of each row against the group's keys and values. Every level must give what
computing each row in full gives, to float32 rounding: the attention (outputs and gradients),
the model's logits on real tokens, and a train step's loss, gradient norm and update. The prefix
length follows the batch's shortest prompt, and a config logged before the option existed
reads as the full computation.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.algorithms import configure
from kernels.attention import causal_mask, dense_attention, shared_prefix_attention
from runtime.config import Config, ConfigError, load_config
from runtime.model import ModelConfig, forward, init_params
from runtime.model.transformer import shared_prefix_forward
from runtime.session import step_config
from runtime.trainer import Sample, StepConfig, make_optimizer, pack, score, train_step
from runtime.trainer.batch import EXACT_PREFIX_TOKENS, shared_prefix

MODEL = ModelConfig(vocab_size=29, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                    intermediate_size=48, initializer_range=0.3)
G, WIDTH = 3, 12
# Three groups: prompts of 4, 6 and 5 tokens; completions from 1 token to the full width.
PROMPTS = [[1, 7, 8, 9], [1, 3, 3, 4, 5, 6], [1, 10, 11, 12, 13]]
COMPLETIONS = [[5], [6, 7, 8, 2], [9, 9, 9, 9, 9, 9, 9, 9], [4, 2], [5, 5, 5], [20, 21, 22, 23, 24, 25],
               [14, 2], [15, 16, 17, 18, 19, 20, 21], [2]]
REWARDS = [1.0, 0.0, 0.5, 0.0, 0.0, 1.0, 0.25, 0.75, 0.5]


def _samples():
    return [Sample(np.int32(PROMPTS[i // G]), np.int32(c), np.float32(-1.0 - 0.1 * np.arange(len(c))), r, 0)
            for i, (c, r) in enumerate(zip(COMPLETIONS, REWARDS, strict=True))]


def steps_side_by_side(params, batch, logp_full, configs):
    """A first train step from ``params`` on ``batch`` under each config: half the rows off-policy,
    with old and reference log-probs a little away from ``logp_full`` (the full step's)."""
    mask = np.asarray(batch.mask_BS)
    current = jnp.asarray(np.arange(batch.size) % 2 == 0)
    old = jnp.asarray(np.where(mask, logp_full + 0.05, 0), jnp.float32)
    ref = jnp.asarray(np.where(mask, logp_full - 0.1, 0), jnp.float32)
    steps = []
    for c in configs:
        p = jax.tree.map(jnp.array, params)
        steps.append(train_step(p, make_optimizer(c).init(p), batch, old, ref, current, config=c))
    return steps


def assert_same_step(params, got, want, metrics):
    """``got`` and ``want`` (``train_step`` outputs from ``params``) agree on ``metrics`` and on the
    update of every parameter, to float32 rounding."""
    (p_got, _, m_got), (p_want, _, m_want) = got, want
    for key in metrics:
        assert float(m_got[key]) == pytest.approx(float(m_want[key]), rel=1e-4, abs=1e-6), key
    for a, b, before in zip(jax.tree.leaves(p_got), jax.tree.leaves(p_want), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(np.float64(a) - before, np.float64(b) - before, atol=1e-5)


@pytest.mark.slow
def test_attention_over_a_shared_prefix_is_dense_attention_over_the_whole_row():
    M, P, T, H, K, D = 2, 3, 4, 4, 2, 8
    keys = jax.random.split(jax.random.key(0), 6)
    q = jax.random.normal(keys[0], (M * G, T, H, D))
    k_pre, v_pre = (jax.random.normal(k, (M, P, K, D)) for k in keys[1:3])
    k_own, v_own = (jax.random.normal(k, (M * G, T, K, D)) for k in keys[3:5])
    weights = jax.random.normal(keys[5], (M * G, T, H, D))
    valid = jnp.array([[True] * T, [True, True, False, False], [True] * T,
                       [True, False, False, False], [True, True, True, False], [True] * T])
    mask_own = causal_mask(valid)

    def shared(q, k_pre, v_pre, k_own, v_own):
        return jnp.sum(weights * shared_prefix_attention(q, k_pre, v_pre, k_own, v_own, mask_own, scale=D ** -0.5))

    def whole(q, k_pre, v_pre, k_own, v_own):
        k = jnp.concatenate([jnp.repeat(k_pre, G, axis=0), k_own], axis=1)
        v = jnp.concatenate([jnp.repeat(v_pre, G, axis=0), v_own], axis=1)
        mask = jnp.concatenate([jnp.ones((M * G, T, P), bool), mask_own], axis=2)
        return jnp.sum(weights * dense_attention(q, k, v, mask, scale=D ** -0.5))

    args = (q, k_pre, v_pre, k_own, v_own)
    got, want = jax.value_and_grad(shared, argnums=range(5))(*args), jax.value_and_grad(whole, argnums=range(5))(*args)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    for g, w in zip(got[1], want[1], strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="whole groups"):
        shared_prefix_attention(q[:5], k_pre, v_pre, k_own[:5], v_own[:5], mask_own[:5], scale=1.0)


@pytest.mark.slow
def test_the_shared_prefix_forward_gives_the_full_forward_on_real_tokens():
    params = init_params(MODEL, key=jax.random.key(1))
    batch = pack(_samples(), group_size=G, width=WIDTH, pad_id=0)
    want = forward(params, batch.tokens_BT, batch.attention_BT, config=MODEL)
    for prefix in (1, 3, 4):  # 4: the shortest prompt
        got = shared_prefix_forward(params, batch.tokens_BT, batch.attention_BT, config=MODEL,
                                    group_size=G, prefix=prefix)
        real = np.asarray(batch.attention_BT)[..., None]
        np.testing.assert_allclose(np.where(real, got, 0), np.where(real, want, 0), atol=2e-5)
    with pytest.raises(ValueError, match="do not fit"):
        shared_prefix_forward(params, batch.tokens_BT, batch.attention_BT, config=MODEL, group_size=G, prefix=WIDTH)
    with pytest.raises(ValueError, match="do not fit"):
        shared_prefix_forward(params, batch.tokens_BT, batch.attention_BT, config=MODEL, group_size=4, prefix=2)


def test_the_prefix_is_the_shortest_prompt_and_a_power_of_two_past_the_exact_range():
    samples = _samples()
    assert shared_prefix(samples, G) == 4
    long = [dataclasses.replace(s, prompt=np.arange(EXACT_PREFIX_TOKENS + 9 + i // G, dtype=np.int32))
            for i, s in enumerate(samples)]
    assert shared_prefix(long, G) == 16  # shortest 25 -> 16
    exact = [dataclasses.replace(s, prompt=np.arange(EXACT_PREFIX_TOKENS, dtype=np.int32)) for s in samples]
    assert shared_prefix(exact, G) == EXACT_PREFIX_TOKENS
    mixed = list(samples)
    mixed[1] = dataclasses.replace(mixed[1], prompt=np.int32(PROMPTS[1]))  # group 0's rows differ
    assert shared_prefix(mixed, G) == 0


def test_more_prefix_lengths_per_octave_follow_the_shortest_prompt_more_closely():
    def at(shortest, per_octave):
        rows = [dataclasses.replace(s, prompt=np.arange(shortest + i // G, dtype=np.int32))
                for i, s in enumerate(_samples())]
        return shared_prefix(rows, G, per_octave)

    assert [at(46, k) for k in (1, 2, 4, 8, 16, 32, 64)] == [32, 32, 40, 44, 46, 46, 46]
    assert [at(n, 8) for n in (16, 17, 31, 32, 33, 63, 64, 100, 200)] == [16, 16, 30, 32, 32, 60, 64, 96, 192]
    assert all(at(n, 1) == 1 << (n.bit_length() - 1) for n in range(EXACT_PREFIX_TOKENS + 1, 300))
    for n in range(1, 300):  # never past the shortest prompt, and at most 8 lengths from 2^k to 2^(k+1)
        assert at(n, 8) <= n
    assert len({at(n, 8) for n in range(64, 128)}) == 8


def test_a_new_run_takes_eight_prefix_lengths_per_octave_and_an_older_one_powers_of_two():
    assert load_config(None, []).trainer.prefix_per_octave == 8
    for bad in (0, 3, 128):
        with pytest.raises(ConfigError) as e:
            load_config(None, [f"trainer.prefix_per_octave={bad}"])
        assert "trainer.prefix_per_octave" in str(e.value) and "power of two" in str(e.value)
    logged = load_config(None, []).to_dict()
    del logged["trainer"]["prefix_per_octave"]
    model = type("M", (), {"config": MODEL})()
    assert step_config(Config.from_dict(logged), model).prefix_per_octave == 1
    assert step_config(load_config(None, []), model).prefix_per_octave == 8


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["grpo", "kl_grpo"])
def test_a_train_step_on_the_shared_prefix_equals_the_full_step(objective):
    obj = configure("grpo", kl_coef=0.05) if objective == "kl_grpo" else configure("grpo")
    params = init_params(MODEL, key=jax.random.key(2))
    samples = _samples()
    batch = jax.device_put(pack(samples, group_size=G, width=WIDTH, pad_id=0))
    # lr 1 and Adam's eps 1: a first step moves each parameter by -g/(|g| + 1), about -g (see
    # test_step), so the update compares gradients rather than their signs.
    full = StepConfig(model=MODEL, objective=obj, learning_rate=1.0, adam_eps=1.0, max_grad_norm=1e9, group_size=G)
    shared = dataclasses.replace(full, share_prefix=True, prefix=shared_prefix(samples, G))
    assert shared.prefix == 4
    mask = np.asarray(batch.mask_BS)
    logp = {c.prefix: np.asarray(score(params, batch.tokens_BT, batch.attention_BT, config=c)) for c in (full, shared)}
    np.testing.assert_allclose(logp[4][mask], logp[0][mask], atol=1e-5)
    out0, out4 = steps_side_by_side(params, batch, logp[0], (full, shared))
    assert_same_step(params, out4, out0, ("loss", "grad_norm"))
    p0, p4 = out0[0], out4[0]
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(p4), jax.tree.leaves(p0), strict=True))


def test_a_new_run_shares_prefixes_unless_a_memory_bound_is_set():
    assert load_config(None, []).trainer.shared_prefix is True
    assert load_config(None, ["trainer.micro_batch_size=128"]).trainer.shared_prefix is False
    assert load_config(None, ["trainer.shared_prefix=false"]).trainer.shared_prefix is False
    with pytest.raises(ConfigError) as e:
        load_config(None, ["trainer.shared_prefix=true", "trainer.remat=true"])
    assert "trainer.shared_prefix" in str(e.value) and "\n" not in str(e.value)


def test_a_config_logged_before_the_option_computes_every_row_in_full():
    logged = load_config(None, []).to_dict()
    del logged["trainer"]["shared_prefix"]
    config = Config.from_dict(logged)
    assert config.trainer.shared_prefix is None
    model = type("M", (), {"config": MODEL})()
    assert step_config(config, model).share_prefix is False
    assert step_config(load_config(None, []), model).share_prefix is True
