"""Ordered attention against dense attention (the training forward's) and paged attention.

Bit equality between the engine's and the trainer's calls needs a process compiled without fused
multiply-adds (``tests/runtime/test_exact_logprobs.py`` runs one); here, in the test process, the
values are checked against the references to float32 rounding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.attention import causal_mask, dense_attention
from kernels.ordered_attention import ordered_attention
from kernels.paged_attention import paged_attention, paged_attention_ordered, paged_attention_reference

TOL = dict(rtol=2e-5, atol=2e-6)  # float32: the sums run in another order than the reference's


def _qkv(seed, B, T, H, K, D, dtype=jnp.float32):
    gen = np.random.default_rng(seed)
    q = jnp.asarray(gen.standard_normal((B, T, H, D)), dtype)
    k = jnp.asarray(gen.standard_normal((B, T, K, D)), dtype)
    v = jnp.asarray(gen.standard_normal((B, T, K, D)), dtype)
    return q, k, v


@pytest.mark.parametrize("block", [1, 3, 4, 16, 64])
@pytest.mark.parametrize("use_jit", [False, True])
def test_ordered_attention_is_dense_attention(block, use_jit):
    q, k, v = _qkv(0, 3, 13, 4, 2, 8)
    lengths = np.array([13, 7, 1])
    valid = jnp.asarray(np.arange(13)[None, :] < lengths[:, None])
    mask = causal_mask(valid)
    f = ordered_attention
    if use_jit:
        f = jax.jit(ordered_attention, static_argnames=("scale", "block"))
    got = f(q, k, v, mask, scale=0.3, block=block)
    want = dense_attention(q, k, v, mask, scale=0.3)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), **TOL)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_gradient_is_dense_attentions(dtype):
    """Differentiated, ordered attention gives dense attention's gradient bit for bit (its own
    backward pass), with a row padded, a query that sees no key, and grouped heads."""
    q, k, v = _qkv(3, 2, 9, 4, 2, 8, dtype)
    valid = jnp.asarray(np.arange(9)[None, :] < np.array([9, 5])[:, None])
    mask = causal_mask(valid).at[1, 2, :].set(False)
    g = jnp.asarray(np.random.default_rng(4).standard_normal(q.shape), dtype)

    def grads(attention):
        _, vjp = jax.vjp(lambda q, k, v: attention(q, k, v, mask, scale=0.35), q, k, v)
        return [np.asarray(x.astype(jnp.float32)) for x in vjp(g)]

    ordered = grads(lambda *a, **kw: ordered_attention(*a, **kw, block=4))
    dense = grads(dense_attention)
    for got, want in zip(ordered, dense, strict=True):
        np.testing.assert_array_equal(got, want)
    assert all(np.abs(x).max() > 0 for x in ordered)
    assert (ordered[0][1, 2] == 0).all()  # a query that sees nothing has no gradient


def test_a_query_that_sees_no_key_gets_zeros_and_padding_stays_finite():
    q, k, v = _qkv(1, 2, 6, 2, 1, 4)
    mask = jnp.zeros((2, 6, 6), bool).at[0, 3, :2].set(True)
    out = np.asarray(ordered_attention(q, k, v, mask, scale=0.5, block=4))
    assert np.isfinite(out).all()
    assert (out[1] == 0).all() and (out[0, :3] == 0).all() and (out[0, 4:] == 0).all()
    np.testing.assert_allclose(out[0, 3], np.asarray(dense_attention(q, k, v, mask, scale=0.5))[0, 3], **TOL)


def test_segments_of_a_packed_row_attend_within_themselves():
    q, k, v = _qkv(2, 1, 12, 2, 2, 4)
    segments = jnp.asarray([[1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 0, 0]])
    valid = segments > 0
    mask = causal_mask(valid) & (segments[:, :, None] == segments[:, None, :])
    got = ordered_attention(q, k, v, mask, scale=0.4, block=4)
    np.testing.assert_allclose(np.asarray(got), np.asarray(dense_attention(q, k, v, mask, scale=0.4)), **TOL)


def test_bad_shapes_are_refused():
    q, k, v = _qkv(3, 1, 4, 3, 2, 4)
    with pytest.raises(ValueError, match="num_heads must be a multiple"):
        ordered_attention(q, k, v, jnp.ones((1, 4, 4), bool), scale=1.0, block=2)


def _paged(seed, lengths, page, pages_per_seq, K=2, G=2, D=8, poison=True):
    """A paged cache holding each sequence's keys/values on shuffled pages, NaN in every unwritten slot."""
    gen = np.random.default_rng(seed)
    B = len(lengths)
    total = 1 + B * pages_per_seq
    k_pages = np.full((K, total, page, D), np.nan if poison else 0.0, np.float32)
    v_pages = k_pages.copy()
    table = 1 + gen.permutation(B * pages_per_seq).reshape(B, pages_per_seq)
    keys = gen.standard_normal((B, pages_per_seq * page, K, D)).astype(np.float32)
    values = gen.standard_normal((B, pages_per_seq * page, K, D)).astype(np.float32)
    for b, n in enumerate(lengths):
        for t in range(n):
            k_pages[:, table[b, t // page], t % page] = keys[b, t]
            v_pages[:, table[b, t // page], t % page] = values[b, t]
    q = jnp.asarray(gen.standard_normal((B, K * G, D)), jnp.float32)
    return q, jnp.asarray(k_pages), jnp.asarray(v_pages), jnp.asarray(lengths, jnp.int32), jnp.asarray(table, jnp.int32)


@pytest.mark.parametrize("page", [1, 4, 5])
def test_paged_ordered_attention_is_the_reference(page):
    lengths = [0, 1, 9, 17, 20]
    q, kp, vp, n, table = _paged(4, lengths, page, -(-20 // page))
    got = paged_attention_ordered(q, kp, vp, n, table, scale=0.35)
    clean = _paged(4, lengths, page, -(-20 // page), poison=False)
    want = paged_attention_reference(*clean, scale=0.35)
    assert np.isfinite(np.asarray(got)).all()  # the NaN of unwritten slots never leaks
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), **TOL)
    assert (np.asarray(got)[0] == 0).all()
    via_dispatch = paged_attention(q, kp, vp, n, table, scale=0.35, impl="ordered")
    assert np.asarray(via_dispatch).tobytes() == np.asarray(got).tobytes()


def test_a_rows_paged_result_does_not_depend_on_the_others():
    lengths = [3, 20, 11]
    q, kp, vp, n, table = _paged(5, lengths, 4, 5)
    together = np.asarray(paged_attention_ordered(q, kp, vp, n, table, scale=0.35))
    for b in range(3):
        alone = np.asarray(paged_attention_ordered(q[b:b + 1], kp, vp, n[b:b + 1], table[b:b + 1], scale=0.35))
        np.testing.assert_allclose(alone[0], together[b], **TOL)
