"""Dense masked attention with grouped-query heads: the training forward and prefill.

For query ``t`` and the keys ``s`` that ``mask_BTS[b, t, s]`` allows:

    out_t = sum_s softmax_s(scale * q_t . k_s) v_s

Scores, softmax and the weighted sum run in float32; ``scale`` is applied once, to the scores; a
query with no allowed key gets a zero output (padding rows stay finite). Query head ``h`` uses kv
head ``h // (num_heads // num_kv_heads)``. The arithmetic mirrors ``paged_attention_reference``
(unnormalised weights, one division at the end) so the decode path and the full forward agree to
float32 rounding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def causal_mask(valid_BT: jax.Array) -> jax.Array:
    """``mask_BTS``: query ``t`` sees key ``s`` iff ``s <= t`` and key ``s`` is a real token."""
    T = valid_BT.shape[1]
    causal_TS = jnp.arange(T)[:, None] >= jnp.arange(T)[None, :]
    return causal_TS[None, :, :] & valid_BT[:, None, :].astype(bool)


def dense_attention(
    q_BTHD: jax.Array,
    k_BSKD: jax.Array,
    v_BSKD: jax.Array,
    mask_BTS: jax.Array,
    *,
    scale: float,
) -> jax.Array:
    """Masked softmax attention; returns ``[B, T, num_heads, head_dim]`` in the dtype of q."""
    B, T, H, D = q_BTHD.shape
    K = k_BSKD.shape[2]
    if H % K or k_BSKD.shape[-1] != D or v_BSKD.shape != k_BSKD.shape:
        raise ValueError(
            f"queries {q_BTHD.shape}, keys {k_BSKD.shape} and values {v_BSKD.shape} do not fit: "
            "num_heads must be a multiple of num_kv_heads and head_dim must match"
        )
    q_BTKGD = q_BTHD.reshape(B, T, K, H // K, D)
    scores_BKGTS = jnp.einsum(
        "btkgd,bskd->bkgts", q_BTKGD, k_BSKD, preferred_element_type=jnp.float32
    ) * jnp.float32(scale)
    mask_B11TS = mask_BTS[:, None, None, :, :]
    scores_BKGTS = jnp.where(mask_B11TS, scores_BKGTS, -jnp.inf)
    max_BKGT1 = jnp.max(scores_BKGTS, axis=-1, keepdims=True)
    max_BKGT1 = jnp.where(jnp.isfinite(max_BKGT1), max_BKGT1, 0.0)
    weights_BKGTS = jnp.where(mask_B11TS, jnp.exp(scores_BKGTS - max_BKGT1), 0.0)
    denom_BKGT1 = jnp.sum(weights_BKGTS, axis=-1, keepdims=True)
    out_BKGTD = jnp.einsum(
        "bkgts,bskd->bkgtd",
        weights_BKGTS,
        v_BSKD.astype(jnp.float32),
        preferred_element_type=jnp.float32,
    )
    out_BKGTD = out_BKGTD / jnp.where(denom_BKGT1 > 0, denom_BKGT1, 1.0)
    return jnp.moveaxis(out_BKGTD, 3, 1).reshape(B, T, H, D).astype(q_BTHD.dtype)
