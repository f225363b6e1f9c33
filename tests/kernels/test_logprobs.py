"""Tempered token log-probs and entropy: hand values, an f64 oracle, edge cases, invariance."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.logprobs import entropy, token_logprobs, token_logprobs_and_entropy


def oracle(logits, tokens, temperature):
    z = np.asarray(logits, np.float64) / np.asarray(temperature, np.float64)[..., None]
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, np.asarray(tokens)[..., None], -1)[..., 0]
    return picked, -(np.exp(logp) * logp).sum(-1)


def test_hand_computed_values():
    logits = np.log(np.array([[1.0, 2.0, 5.0]], np.float32))
    # T = 1: p = [1, 2, 5] / 8, so log p(2) = log(5/8).
    assert float(token_logprobs(logits, np.array([2]))[0]) == pytest.approx(
        math.log(5 / 8), abs=1e-6
    )
    # T = 2: p ∝ sqrt([1, 2, 5]); log p(0) = -log(1 + sqrt 2 + sqrt 5).
    expected = -math.log(1 + math.sqrt(2) + math.sqrt(5))
    assert float(token_logprobs(logits, np.array([0]), 2.0)[0]) == pytest.approx(expected, abs=1e-6)
    # Uniform over 3 tokens: entropy log 3.
    assert float(entropy(np.zeros((1, 3)))[0]) == pytest.approx(math.log(3), abs=1e-6)


@pytest.mark.parametrize("use_jit", [False, True])
def test_matches_float64_oracle_with_per_row_temperatures(use_jit):
    rng = np.random.default_rng(0)
    logits = (4 * rng.normal(size=(3, 5, 50))).astype(np.float32)
    tokens = rng.integers(0, 50, (3, 5))
    temperature = np.array([[0.5], [1.0], [1.7]], np.float32) * np.ones((3, 5), np.float32)
    maybe_jit = jax.jit if use_jit else (lambda f: f)
    logp, ent = maybe_jit(token_logprobs_and_entropy)(logits, tokens, temperature)
    want_logp, want_ent = oracle(logits, tokens, temperature)
    assert logp.dtype == ent.dtype == jnp.float32 and logp.shape == ent.shape == (3, 5)
    np.testing.assert_allclose(np.asarray(logp), want_logp, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(ent), want_ent, atol=1e-5, rtol=0)
    # The fused and the separate functions give the same bits under the same mode.
    np.testing.assert_array_equal(maybe_jit(token_logprobs)(logits, tokens, temperature), logp)
    np.testing.assert_array_equal(maybe_jit(entropy)(logits, temperature), ent)


def test_non_positive_temperature_scores_the_untempered_distribution():
    logits = np.random.default_rng(1).normal(size=(2, 7)).astype(np.float32)
    tokens = np.array([3, 6])
    untempered = np.asarray(token_logprobs(logits, tokens))
    np.testing.assert_array_equal(np.asarray(token_logprobs(logits, tokens, 0.0)), untempered)
    np.testing.assert_array_equal(
        np.asarray(token_logprobs(logits, tokens, np.array([0.0, -1.0]))), untempered
    )


def test_extreme_logits_stay_finite_and_bf16_is_scored_in_float32():
    logits = np.array([[1e4, 0.0, -1e4]], np.float32)
    logp, ent = token_logprobs_and_entropy(logits, np.array([1]), 0.7)
    # log p(1) = -(1e4 / 0.7) up to the negligible exp(-1e4/0.7 * 2) term.
    assert float(logp[0]) == pytest.approx(-1e4 / 0.7, rel=1e-6)
    assert float(ent[0]) == pytest.approx(0.0, abs=1e-6)
    bf16 = jnp.asarray(np.log([[1.0, 3.0]]), jnp.bfloat16)
    out = token_logprobs(bf16, np.array([1]))
    assert out.dtype == jnp.float32
    exact = jax.nn.log_softmax(bf16.astype(jnp.float32))[0, 1]
    assert float(out[0]) == float(exact)


def test_a_row_does_not_depend_on_the_batch():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(8, 300)).astype(np.float32)
    tokens = rng.integers(0, 300, 8)
    fn = jax.jit(token_logprobs_and_entropy)
    full = fn(logits, tokens, 0.9)
    other = logits.copy()
    other[1:] = rng.normal(size=(7, 300))
    changed = fn(other, tokens, 0.9)
    for a, b in zip(full, changed, strict=True):
        assert np.asarray(a)[0] == np.asarray(b)[0]
