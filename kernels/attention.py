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


def check_heads(q_BTHD: jax.Array, k_BSKD: jax.Array, v_BSKD: jax.Array) -> None:
    """Refuse queries, keys and values whose heads do not fit grouped-query attention."""
    H, D, K = q_BTHD.shape[2], q_BTHD.shape[3], k_BSKD.shape[2]
    if H % K or k_BSKD.shape[-1] != D or v_BSKD.shape != k_BSKD.shape:
        raise ValueError(
            f"queries {q_BTHD.shape}, keys {k_BSKD.shape} and values {v_BSKD.shape} do not fit: "
            "num_heads must be a multiple of num_kv_heads and head_dim must match"
        )


def dense_attention(
    q_BTHD: jax.Array,
    k_BSKD: jax.Array,
    v_BSKD: jax.Array,
    mask_BTS: jax.Array,
    *,
    scale: float,
) -> jax.Array:
    """Masked softmax attention; returns ``[B, T, num_heads, head_dim]`` in the dtype of q."""
    check_heads(q_BTHD, k_BSKD, v_BSKD)
    B, T, H, D = q_BTHD.shape
    K = k_BSKD.shape[2]
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


def query_blocked_attention(
    q_BTHD: jax.Array,
    k_BSKD: jax.Array,
    v_BSKD: jax.Array,
    mask_BTS: jax.Array,
    *,
    scale: float,
    block: int,
) -> jax.Array:
    """``dense_attention`` ``block`` queries at a time, each block under ``jax.checkpoint``.

    Every query's softmax runs over all its keys as in ``dense_attention``, so each output row is
    the same arithmetic on the same inputs (matmuls of other shapes may round it differently in
    the last bit). Only one block's ``[B, heads, block, S]`` float32 scores and weights exist at a
    time, in the forward pass and, since the backward pass recomputes them block by block, in the
    backward pass too. The last block is padded with queries that see no key (zero output,
    dropped). ``block <= 0`` or ``block >= T``: ``dense_attention`` itself.
    """
    B, T, H, D = q_BTHD.shape
    if block <= 0 or block >= T:
        return dense_attention(q_BTHD, k_BSKD, v_BSKD, mask_BTS, scale=scale)
    N = -(-T // block)
    pad = N * block - T
    q_NBCHD = jnp.moveaxis(
        jnp.pad(q_BTHD, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(B, N, block, H, D), 1, 0
    )
    mask_NBCS = jnp.moveaxis(
        jnp.pad(mask_BTS, ((0, 0), (0, pad), (0, 0))).reshape(B, N, block, -1), 1, 0
    )

    @jax.checkpoint
    def one_block(inputs):
        q_BCHD, mask_BCS = inputs
        return dense_attention(q_BCHD, k_BSKD, v_BSKD, mask_BCS, scale=scale)

    out_NBCHD = jax.lax.map(one_block, (q_NBCHD, mask_NBCS))
    return jnp.moveaxis(out_NBCHD, 0, 1).reshape(B, N * block, H, D)[:, :T]


def shared_prefix_attention(
    q_BTHD: jax.Array,
    k_prefix_MPKD: jax.Array,
    v_prefix_MPKD: jax.Array,
    k_BTKD: jax.Array,
    v_BTKD: jax.Array,
    mask_BTT: jax.Array,
    *,
    scale: float,
) -> jax.Array:
    """Attention of rows that continue a prefix shared by each group of ``G = B / M`` rows.

    Row ``b`` belongs to group ``b // G``, whose ``P`` prefix keys and values every query of the
    row sees; among the row's own keys, ``mask_BTT`` says which each query sees. The prefix is
    stored once per group, ``[M, P, num_kv_heads, head_dim]``, and broadcast over the group's rows
    inside the score and output contractions, so its gradient sums over them with no copy. One
    softmax runs over the prefix and the row's keys together, with ``dense_attention``'s
    arithmetic (float32 scores, unnormalised weights, one division at the end).
    """
    B, T, H, D = q_BTHD.shape
    M, P, K, _ = k_prefix_MPKD.shape
    if B % M or H % K or k_BTKD.shape[2] != K or k_BTKD.shape[-1] != D:
        raise ValueError(
            f"queries {q_BTHD.shape}, prefix keys {k_prefix_MPKD.shape} and keys {k_BTKD.shape} do "
            "not fit: rows must be whole groups of the prefix's rows and the heads must match"
        )
    G, Hk = B // M, H // K
    q_MGTKHD = q_BTHD.reshape(M, G, T, K, Hk, D)
    s = jnp.float32(scale)
    prefix_MGKHTP = jnp.einsum(
        "mgtkhd,mpkd->mgkhtp", q_MGTKHD, k_prefix_MPKD, preferred_element_type=jnp.float32
    ) * s
    own_MGKHTS = jnp.einsum(
        "mgtkhd,mgskd->mgkhts", q_MGTKHD, k_BTKD.reshape(M, G, T, K, D),
        preferred_element_type=jnp.float32,
    ) * s
    mask_MG11TS = mask_BTT.reshape(M, G, 1, 1, T, T)
    own_MGKHTS = jnp.where(mask_MG11TS, own_MGKHTS, -jnp.inf)
    # Every query sees at least the prefix (P >= 1), so each maximum is finite.
    max_MGKHT1 = jnp.maximum(
        jnp.max(prefix_MGKHTP, axis=-1, keepdims=True), jnp.max(own_MGKHTS, axis=-1, keepdims=True)
    )
    w_prefix = jnp.exp(prefix_MGKHTP - max_MGKHT1)
    w_own = jnp.where(mask_MG11TS, jnp.exp(own_MGKHTS - max_MGKHT1), 0.0)
    denom_MGKHT1 = jnp.sum(w_prefix, axis=-1, keepdims=True) + jnp.sum(w_own, axis=-1, keepdims=True)
    out_MGKHTD = jnp.einsum(
        "mgkhtp,mpkd->mgkhtd", w_prefix, v_prefix_MPKD.astype(jnp.float32),
        preferred_element_type=jnp.float32,
    ) + jnp.einsum(
        "mgkhts,mgskd->mgkhtd", w_own, v_BTKD.reshape(M, G, T, K, D).astype(jnp.float32),
        preferred_element_type=jnp.float32,
    )
    out_MGKHTD = out_MGKHTD / denom_MGKHT1
    return jnp.moveaxis(out_MGKHTD, 4, 2).reshape(B, T, H, D).astype(q_BTHD.dtype)
