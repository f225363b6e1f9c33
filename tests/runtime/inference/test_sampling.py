"""The sampler: parameters, keys, top-k/top-p truncation, draws and their log-probs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.logprobs import tempered_log_softmax
from runtime.errors import UsageError
from runtime.inference.sampling import (
    SamplingParams,
    finish_reason,
    sample,
    seed_key_data,
    truncation_mask,
)

sample_jit = jax.jit(sample)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("temperature", -0.1, r"temperature=-0.1 is not accepted; it must be 0 \(greedy\) or a"),
        ("temperature", 1e-6, "temperature=1e-06 is not accepted"),
        ("temperature", float("nan"), "temperature=nan"),
        ("top_k", -1, "top_k=-1 is not accepted; it must be an integer >= 0"),
        ("top_k", 2.5, "top_k=2.5"),
        ("top_p", 0.0, r"top_p=0.0 is not accepted; it must be in \(0, 1\]"),
        ("top_p", 1.5, "top_p=1.5"),
        ("max_tokens", 0, "max_tokens=0 is not accepted; it must be an integer >= 1"),
        ("stop_token_ids", 2, "stop_token_ids=2 is not accepted"),
        ("stop_token_ids", (1, -3), r"stop_token_ids=\(1, -3\)"),
    ],
)
def test_bad_params_are_rejected(field, value, message):
    with pytest.raises(UsageError, match=message):
        SamplingParams(**{field: value})


def test_params_normalise_and_stop_ids():
    p = SamplingParams(
        temperature=1, top_p=1, stop_token_ids=[5, np.int64(7)], max_tokens=np.int32(4)
    )
    assert p.stop_token_ids == (5, 7) and isinstance(p.temperature, float)
    assert type(p.stop_token_ids[1]) is int and type(p.max_tokens) is int and p.max_tokens == 4
    assert p.stop_ids((2,)) == {2, 5, 7}
    assert SamplingParams(stop_token_ids=[5], ignore_eos=True).stop_ids((2,)) == {5}
    assert finish_reason(5, 1, 3, frozenset({5})) == "stop"
    assert finish_reason(4, 3, 3, frozenset({5})) == "length"
    assert finish_reason(5, 3, 3, frozenset({5})) == "stop"  # a stop token wins over the length
    assert finish_reason(4, 2, 3, frozenset({5})) is None


def test_seed_keys_are_jax_keys_of_the_seed():
    for seed in (0, 1, 12345, 2**31 - 1):
        expected = jax.random.key_data(jax.random.key(seed, impl="threefry2x32"))
        np.testing.assert_array_equal(seed_key_data(seed), expected)
    for seed in (2**32 + 5, 2**63 + 17, 2**64 - 1):  # every bit kept: [high word, low word]
        np.testing.assert_array_equal(seed_key_data(seed), np.array([seed >> 32, seed & 0xFFFFFFFF], np.uint32))
    for bad in (-1, 2**64, True, 1.0):
        with pytest.raises(UsageError, match=r"seed .* is not accepted; a seed is an integer in"):
            seed_key_data(bad)


def _mask_reference(u, k, p):
    """Top-k then top-p by sorting one row in numpy; ties with the last kept token are kept."""
    order = np.argsort(-u, kind="stable")
    k = len(u) if k == 0 else min(k, len(u))
    top = order[:k]
    probs = np.exp(u[top] - u[top].max())
    probs /= probs.sum()
    mass, kept = 0.0, 0
    for q in probs:
        if p < 1.0 and mass >= p:
            break
        mass, kept = mass + q, kept + 1
    return u >= u[top[kept - 1]]


def test_truncation_matches_a_sorting_reference():
    gen = np.random.default_rng(0)
    rows, ks, ps = [], [], []
    for _ in range(64):
        u = gen.normal(size=23).astype(np.float32) * gen.uniform(0.1, 4)
        if gen.random() < 0.3:
            u = np.round(u)  # ties
        rows.append(u)
        ks.append(int(gen.choice([0, 1, 2, 5, 23, 40])))
        ps.append(float(gen.choice([1.0, 0.9, 0.5, 0.05, 1e-6])))
    rows_BV, ks_B, ps_B = jnp.asarray(np.stack(rows)), jnp.array(ks), jnp.array(ps, jnp.float32)
    got = np.asarray(jax.jit(truncation_mask)(rows_BV, ks_B, ps_B))
    for i, u in enumerate(rows):
        np.testing.assert_array_equal(got[i], _mask_reference(u, ks[i], ps[i]), err_msg=f"row {i}")
    # Hand-checked: probs ∝ exp([2, 1, 0, -1]) = [.644, .237, .087, .032]; p = 0.85 keeps two.
    u = jnp.array([[1.0, 2.0, -1.0, 0.0]])
    top_p = truncation_mask(u, jnp.array([0]), jnp.array([0.85]))
    np.testing.assert_array_equal(top_p, [[1, 1, 0, 0]])
    top_k = truncation_mask(u, jnp.array([3]), jnp.array([1.0]))
    np.testing.assert_array_equal(top_k, [[1, 1, 0, 1]])


def _row_inputs(n, temperature=1.0, top_k=0, top_p=1.0):
    return (
        jnp.full((n,), temperature, jnp.float32),
        jnp.full((n,), top_k, jnp.int32),
        jnp.full((n,), top_p, jnp.float32),
    )


def test_draws_follow_the_truncated_distribution():
    logits = jnp.array([0.5, 2.0, -1.0, 1.0, 0.0, 1.5], jnp.float32)
    n, T = 6000, 0.7
    keys = jnp.broadcast_to(jnp.asarray(seed_key_data(3)), (n, 2))
    for top_k, top_p in [(0, 1.0), (3, 1.0), (0, 0.8)]:
        tokens, logprobs = sample_jit(
            jnp.broadcast_to(logits, (n, 6)), keys, jnp.arange(n), *_row_inputs(n, T, top_k, top_p)
        )
        keep = _mask_reference(np.asarray(logits) / T, top_k, top_p)
        probs = np.where(keep, np.exp(np.asarray(logits) / T), 0)
        probs /= probs.sum()
        freq = np.bincount(np.asarray(tokens), minlength=6) / n
        assert set(np.flatnonzero(freq)) <= set(np.flatnonzero(keep))
        # 6000 draws: the standard error of a frequency is at most sqrt(.25 / 6000) = 0.0065.
        np.testing.assert_allclose(freq, probs, atol=0.03)
        # The recorded log-prob is of the untruncated tempered distribution.
        expected = np.asarray(tempered_log_softmax(logits, T))[np.asarray(tokens)]
        np.testing.assert_allclose(np.asarray(logprobs), expected, rtol=1e-6)


def test_greedy_and_top_k_one_take_the_argmax():
    gen = np.random.default_rng(1)
    logits = jnp.asarray(gen.normal(size=(5, 17)), jnp.float32)
    keys = jnp.asarray(np.stack([seed_key_data(s) for s in range(5)]))
    greedy, greedy_lp = sample_jit(logits, keys, jnp.arange(5), *_row_inputs(5, 0.0))
    top1, top1_lp = sample_jit(logits, keys, jnp.arange(5), *_row_inputs(5, 0.5, top_k=1))
    argmax = np.argmax(np.asarray(logits), -1)
    np.testing.assert_array_equal(greedy, argmax)
    np.testing.assert_array_equal(top1, argmax)
    lsm = np.asarray(jax.nn.log_softmax(logits))
    np.testing.assert_allclose(greedy_lp, lsm[np.arange(5), argmax], rtol=1e-6)  # T = 1 if greedy
    lsm_half = np.asarray(jax.nn.log_softmax(logits / 0.5))
    np.testing.assert_allclose(top1_lp, lsm_half[np.arange(5), argmax], rtol=1e-6)


def test_a_row_draws_the_same_bits_whatever_the_other_rows_and_its_row():
    gen = np.random.default_rng(2)

    def batch(seeds):
        logits = jnp.asarray(gen.normal(size=(4, 31)), jnp.float32)
        keys = jnp.asarray(np.stack([seed_key_data(s) for s in seeds]))
        index = jnp.asarray(gen.integers(0, 50, 4))
        temp = jnp.asarray(gen.choice([0.0, 0.7, 1.3], 4), jnp.float32)
        top_k = jnp.asarray(gen.integers(0, 9, 4))
        top_p = jnp.asarray(gen.uniform(0.3, 1, 4), jnp.float32)
        return [logits, keys, index, temp, top_k, top_p]

    first = batch([11, 12, 13, 14])
    tokens, logprobs = sample_jit(*first)
    for row in range(4):
        # Row 3 of the first batch moved to `row`, among other requests.
        second = [a.at[row].set(b[3]) for a, b in zip(batch([21, 22, 23, 24]), first, strict=True)]
        t2, lp2 = sample_jit(*second)
        assert int(t2[row]) == int(tokens[3])
        assert np.asarray(lp2)[row].tobytes() == np.asarray(logprobs)[3].tobytes()
    # The draw is keyed by (seed, index): other indices draw from other keys.
    draws = sample_jit(
        jnp.broadcast_to(first[0][0], (64, 31)), jnp.broadcast_to(first[1][0], (64, 2)),
        jnp.arange(64), *_row_inputs(64, 1.0),
    )[0]
    assert len(set(np.asarray(draws).tolist())) > 10
