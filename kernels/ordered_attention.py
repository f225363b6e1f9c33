"""Attention whose every output element is one fixed sequence of float32 operations.

The exact-log-prob mode (``trainer.exact_logprobs``) needs the trainer's forward pass to give the
engine's bits for every position, although the engine computes a prompt in a prefill and each
later token in its own decode step, over other shapes, and the trainer computes whole rows at
once. A matmul or a ``sum`` leaves its summation order to the compiler, which picks it per shape;
so here no reduction is left to the compiler:

- keys are taken ``block`` at a time, in order (the engine's pages, the trainer's ``block``-wide
  slices of a row: the same groups of keys when ``block`` is the page size);
- each block is one online-softmax step (:func:`block_step`): the scores ``q . k`` are summed over
  the head dimension one term after the other, the maximum and the weights' sum over the block's
  keys likewise, and the weighted values too — elementwise operations only, so the compiler can
  vectorise over the other axes but cannot reorder a sum;
- a key a query may not see (past it, padding, another sequence) is selected away with ``where``;
  a block with no key a query may see leaves that query's state untouched (a selection, not an
  update by zero), so a query's result does not depend on how many blocks follow its last one.

So ``ordered_attention`` over a row and ``kernels.paged_attention``'s ``"ordered"`` implementation
over the pages the engine wrote do the same operations on the same values for each query, whatever the batch, the row width
or the number of live pages. One further condition is the compiler's: it must not contract a
multiplication and an addition into one fused multiply-add in one program and not in another
(XLA:CPU does, inside its fusions, as the shapes lead it), which ``runtime.numerics`` arranges.

Shapes: ``B`` rows, ``T`` queries, ``S`` keys, ``H`` query heads, ``K`` kv heads, ``G = H / K``
query heads per kv head, ``D`` head dim, ``Q`` queries of one kv head (``T·G``), ``C`` keys of one
block. Scores, softmax and the weighted sum are float32; the output has the dtype of ``q``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernels.attention import check_heads, dense_attention

State = tuple[jax.Array, jax.Array, jax.Array]  # running max [..., 1], weight sum [..., 1], values [..., D]


def _in_order(terms: list[jax.Array], combine) -> jax.Array:
    total = terms[0]
    for term in terms[1:]:
        total = combine(total, term)
    return total


def block_step(
    state: State,
    q_XQD: jax.Array,
    k_XCD: jax.Array,
    v_XCD: jax.Array,
    valid_XQC: jax.Array,
    *,
    scale: float,
) -> State:
    """One block of keys into each query's online softmax (``X`` any leading axes).

    ``valid_XQC`` (broadcastable to ``[..., Q, C]``) says which keys each query sees; a query
    that sees none of the block keeps its state. ``v_XCD`` must be finite where any query sees it
    (the engine zeroes unwritten page slots before calling).
    """
    max_XQ1, denom_XQ1, acc_XQD = state
    D, C = q_XQD.shape[-1], k_XCD.shape[-2]
    # The summed axis leading, so that each term is a contiguous slice.
    q_DXQ1 = jnp.moveaxis(q_XQD.astype(jnp.float32), -1, 0)[..., None]
    k_DX1C = jnp.moveaxis(k_XCD.astype(jnp.float32), -1, 0)[..., None, :]
    v_CX1D = jnp.moveaxis(v_XCD.astype(jnp.float32), -2, 0)[..., None, :]
    # scores[q, c] = q_q . k_c, summed over the head dimension term by term: a loop, not D
    # operations in the program (a model's every layer has one, and the compile time would follow).
    scores_XQC = jax.lax.fori_loop(
        1, D, lambda d, total: total + q_DXQ1[d] * k_DX1C[d], q_DXQ1[0] * k_DX1C[0]
    ) * jnp.float32(scale)
    valid_XQC = jnp.broadcast_to(valid_XQC, scores_XQC.shape)
    scores_XQC = jnp.where(valid_XQC, scores_XQC, -jnp.inf)
    valid_CXQ = jnp.moveaxis(valid_XQC, -1, 0)
    live_XQ1 = _in_order([valid_CXQ[c] for c in range(C)], jnp.logical_or)[..., None]
    block_max_XQ1 = _in_order([s for s in jnp.moveaxis(scores_XQC, -1, 0)], jnp.maximum)[..., None]
    new_max_XQ1 = jnp.where(live_XQ1, jnp.maximum(max_XQ1, block_max_XQ1), 0.0)
    rescale_XQ1 = jnp.exp(max_XQ1 - new_max_XQ1)
    weights_CXQ = jnp.moveaxis(jnp.where(valid_XQC, jnp.exp(scores_XQC - new_max_XQ1), 0.0), -1, 0)
    block_sum_XQ1 = _in_order([weights_CXQ[c] for c in range(C)], jnp.add)[..., None]
    block_acc_XQD = _in_order([weights_CXQ[c][..., None] * v_CX1D[c] for c in range(C)], jnp.add)
    return (
        jnp.where(live_XQ1, new_max_XQ1, max_XQ1),
        jnp.where(live_XQ1, rescale_XQ1 * denom_XQ1 + block_sum_XQ1, denom_XQ1),
        jnp.where(live_XQ1, rescale_XQ1 * acc_XQD + block_acc_XQD, acc_XQD),
    )


def initial_state(lead: tuple[int, ...], D: int) -> State:
    """The state of queries that have seen no key: ``lead`` is ``[..., Q]``."""
    return (
        jnp.full(lead + (1,), -jnp.inf, jnp.float32),
        jnp.zeros(lead + (1,), jnp.float32),
        jnp.zeros(lead + (D,), jnp.float32),
    )


def finish(state: State) -> jax.Array:
    """The attention output ``[..., D]`` (float32): zero for a query that saw no key."""
    _, denom_XQ1, acc_XQD = state
    return acc_XQD / jnp.where(denom_XQ1 > 0, denom_XQ1, 1.0)


def ordered_attention(
    q_BTHD: jax.Array,
    k_BSKD: jax.Array,
    v_BSKD: jax.Array,
    mask_BTS: jax.Array,
    *,
    scale: float,
    block: int,
) -> jax.Array:
    """Masked softmax attention of every query over ``block``-key blocks of its row, in order.

    ``mask_BTS[b, t, s]``: query ``t`` sees key ``s``. Key ``s`` is in block ``s // block``, so
    for the engine's bits key 0 of a row must be position 0 of its sequence (a packed row's
    sequences each start on a block boundary). Returns ``[B, T, H, D]`` in the dtype of q.

    Its gradient is ``dense_attention``'s (recomputed from the inputs): the derivative of the
    same function, with the compiler's summation orders. Only the forward values must be the
    engine's; differentiating the ordered sums would cost a train step several times the
    attention's own work (a loop over the head dimension, run backwards, in every layer).
    """
    check_heads(q_BTHD, k_BSKD, v_BSKD)
    if block < 1:
        raise ValueError(f"block {block} is not accepted: it must be >= 1")
    return _ordered_attention(q_BTHD, k_BSKD, v_BSKD, mask_BTS, scale, block)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _ordered_attention(q_BTHD, k_BSKD, v_BSKD, mask_BTS, scale: float, block: int) -> jax.Array:
    B, T, H, D = q_BTHD.shape
    S, K = k_BSKD.shape[1], k_BSKD.shape[2]
    G, N = H // K, -(-S // block)
    pad = N * block - S
    # [B, S, K, D] -> [N, B, K, C, D]: the blocks of each row's keys, in order.
    def blocks(x_BSKD):
        x_BSKD = jnp.pad(x_BSKD, ((0, 0), (0, pad), (0, 0), (0, 0)))
        return jnp.moveaxis(x_BSKD.reshape(B, N, block, K, D), (1, 3), (0, 2))

    mask_NB1QC = jnp.moveaxis(
        jnp.pad(mask_BTS, ((0, 0), (0, 0), (0, pad))).reshape(B, T, 1, N, block), 3, 0
    )
    mask_NB1QC = jnp.broadcast_to(mask_NB1QC, (N, B, T, G, block)).reshape(N, B, 1, T * G, block)
    q_BKQD = jnp.moveaxis(q_BTHD.reshape(B, T, K, G, D), 1, 2).reshape(B, K, T * G, D)

    def step(state, inputs):
        k_BKCD, v_BKCD, valid_B1QC = inputs
        return block_step(state, q_BKQD, k_BKCD, v_BKCD, valid_B1QC, scale=scale), None

    state, _ = jax.lax.scan(step, initial_state((B, K, T * G), D), (blocks(k_BSKD), blocks(v_BSKD), mask_NB1QC))
    out_BKQD = finish(state)
    return jnp.moveaxis(out_BKQD.reshape(B, K, T, G, D), 2, 1).reshape(B, T, H, D).astype(q_BTHD.dtype)


def _ordered_attention_forward(q_BTHD, k_BSKD, v_BSKD, mask_BTS, scale, block):
    out = _ordered_attention(q_BTHD, k_BSKD, v_BSKD, mask_BTS, scale, block)
    return out, (q_BTHD, k_BSKD, v_BSKD, mask_BTS)


def _ordered_attention_backward(scale, block, inputs, g_BTHD):
    q_BTHD, k_BSKD, v_BSKD, mask_BTS = inputs
    _, vjp = jax.vjp(lambda q, k, v: dense_attention(q, k, v, mask_BTS, scale=scale), q_BTHD, k_BSKD, v_BSKD)
    return (*vjp(g_BTHD), None)


_ordered_attention.defvjp(_ordered_attention_forward, _ordered_attention_backward)
