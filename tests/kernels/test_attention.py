"""``query_blocked_attention`` is ``dense_attention`` a block of queries at a time.

A ragged padded batch (a left-padded row, a row of padding only at the end, a query with no
allowed key) with grouped-query heads; blocks of 3 queries over 7 (a padded last block), of 1,
and of the whole width. Outputs and the gradients of a weighted sum with respect to queries,
keys and values must equal the dense ones to float32 rounding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.attention import causal_mask, dense_attention, query_blocked_attention

B, T, H, K, D = 2, 7, 4, 2, 8
SCALE = D ** -0.5


def _inputs():
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (B, T, H, D))
    k = jax.random.normal(keys[1], (B, T, K, D))
    v = jax.random.normal(keys[2], (B, T, K, D))
    weights = jax.random.normal(keys[3], (B, T, H, D))
    valid_BT = jnp.array([[False, False, True, True, True, True, True],
                          [True, True, True, True, True, False, False]])
    return q, k, v, weights, causal_mask(valid_BT)


@pytest.mark.slow
@pytest.mark.parametrize("block", [3, 1, T, 0])
def test_blocks_of_queries_give_the_dense_output_and_gradient(block):
    q, k, v, weights, mask = _inputs()

    def loss(attention, q, k, v):
        return jnp.sum(weights * attention(q, k, v, mask, scale=SCALE))

    def blocked(q, k, v, mask, *, scale):
        return query_blocked_attention(q, k, v, mask, scale=scale, block=block)

    want = jax.jit(jax.value_and_grad(lambda *a: loss(dense_attention, *a), argnums=(0, 1, 2)))
    got = jax.jit(jax.value_and_grad(lambda *a: loss(blocked, *a), argnums=(0, 1, 2)))
    (want_loss, want_grads), (got_loss, got_grads) = want(q, k, v), got(q, k, v)
    assert float(got_loss) == pytest.approx(float(want_loss), rel=1e-6, abs=1e-5)
    for g, w in zip(got_grads, want_grads, strict=True):
        assert float(jnp.max(jnp.abs(w))) > 0.1
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5)
    out_want = dense_attention(q, k, v, mask, scale=SCALE)
    out_got = blocked(q, k, v, mask, scale=SCALE)
    np.testing.assert_allclose(out_got, out_want, rtol=0, atol=1e-6)
    # Row 0's first two queries see no key (left padding): zero output, as dense attention gives.
    assert np.all(np.asarray(out_got)[0, :2] == 0)
