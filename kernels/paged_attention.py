"""Decode attention over a paged KV cache.

Cache layout (the layout of JAX's Pallas TPU paged-attention op):

- ``k_pages_KNSD``, ``v_pages_KNSD``: ``[num_kv_heads, total_pages, page_size, head_dim]``;
- ``lengths_B``: ``int32[B]``, the number of cached tokens of each sequence (0 = empty slot);
- ``page_indices_BP``: ``int32[B, pages_per_seq]``, the physical page holding logical page ``p``
  of sequence ``b``; entries past a sequence's last page are padding and are never read as valid
  data, but must still be page ids in ``[0, total_pages)`` (use a reserved null page).

Each query head ``h`` attends with kv head ``h // (num_heads // num_kv_heads)`` (grouped-query
attention). For sequence ``b`` with ``n = lengths_B[b]`` cached tokens ``k_0..k_{n-1}``:

    out_b = sum_j softmax_j(scale * q_b . k_j) v_j,    j < n

with the softmax computed in float32 and ``scale`` applied exactly once, to the scores. Cached
slots at or past ``n`` never contribute, whatever they hold (NaN included): they are selected away
with ``where``, never multiplied by zero. A sequence with ``n = 0`` gets a zero output.

Four implementations share this contract, chosen by ``impl=``:

- ``"reference"``: gathers each sequence's pages and runs dense masked attention in ``jnp``. The
  oracle. A row's result depends only on that row's inputs at a fixed ``[B, pages_per_seq]``
  shape, which the inference engine's batch invariance relies on; its cost follows
  ``pages_per_seq``, the longest sequence the engine can hold, however short the live ones are.
- ``"live"``: the Pallas kernel's online softmax in ``jnp``, one logical page at a time over the
  pages of the longest live sequence only (a loop whose trip count is computed from
  ``lengths_B``, so one compiled program serves every length): its cost follows the longest live
  sequence. A row's state changes only on its own pages, in page order, so its result does not
  depend on the other rows' lengths (batch invariance). One page gives the reference's bits.
- ``"ordered"``: ``kernels.ordered_attention``'s page-by-page online softmax with every sum in a
  fixed order (elementwise operations only), the bits the trainer's exact-log-prob forward pass
  computes for the same query (``trainer.exact_logprobs``); slower than ``"live"``.
- ``"pallas"``: a Pallas TPU kernel (``pallas_interpret`` runs the same kernel in interpret mode,
  which is how it is tested on CPU). Lengths and page indices are scalar-prefetched; the BlockSpec
  index map picks the physical page, so no gathered copy of the cache is materialised. The grid is
  ``(B, num_kv_heads, pages_per_seq)`` with an online softmax over the page axis.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels.ordered_attention import block_step, finish, initial_state

IMPLS = ("reference", "live", "ordered", "pallas", "pallas_interpret")


def paged_attention(
    q_BHD: jax.Array,
    k_pages_KNSD: jax.Array,
    v_pages_KNSD: jax.Array,
    lengths_B: jax.Array,
    page_indices_BP: jax.Array,
    *,
    scale: float,
    impl: str = "reference",
) -> jax.Array:
    """Single-query attention of each sequence over its cached tokens.

    Args:
      q_BHD: queries, one per sequence, ``[B, num_heads, head_dim]``.
      k_pages_KNSD: key pages, ``[num_kv_heads, total_pages, page_size, head_dim]``.
      v_pages_KNSD: value pages, same shape as ``k_pages_KNSD``.
      lengths_B: int32 number of valid cached tokens per sequence.
      page_indices_BP: int32 physical page of each logical page, ``[B, pages_per_seq]``.
      scale: multiplier of the scores (usually ``head_dim ** -0.5``), applied once.
      impl: one of ``IMPLS``.

    Returns:
      ``[B, num_heads, head_dim]`` in the dtype of ``q_BHD``.
    """
    if impl == "reference":
        return paged_attention_reference(
            q_BHD, k_pages_KNSD, v_pages_KNSD, lengths_B, page_indices_BP, scale=scale
        )
    if impl == "live":
        return paged_attention_live(
            q_BHD, k_pages_KNSD, v_pages_KNSD, lengths_B, page_indices_BP, scale=scale
        )
    if impl == "ordered":
        return paged_attention_ordered(
            q_BHD, k_pages_KNSD, v_pages_KNSD, lengths_B, page_indices_BP, scale=scale
        )
    if impl in ("pallas", "pallas_interpret"):
        return paged_attention_pallas(
            q_BHD,
            k_pages_KNSD,
            v_pages_KNSD,
            lengths_B,
            page_indices_BP,
            scale=scale,
            interpret=impl == "pallas_interpret",
        )
    raise ValueError(f"unknown paged attention impl {impl!r}; accepted: {', '.join(IMPLS)}")


def _check_shapes(q_BHD, k_pages_KNSD, v_pages_KNSD, lengths_B, page_indices_BP) -> None:
    B, H, D = q_BHD.shape
    K, _, _, Dk = k_pages_KNSD.shape
    if k_pages_KNSD.shape != v_pages_KNSD.shape:
        raise ValueError(f"k pages {k_pages_KNSD.shape} and v pages {v_pages_KNSD.shape} differ")
    if Dk != D or H % K:
        raise ValueError(
            f"queries {q_BHD.shape} do not fit pages {k_pages_KNSD.shape}: head_dim must match "
            "and num_heads must be a multiple of num_kv_heads"
        )
    if lengths_B.shape != (B,) or page_indices_BP.ndim != 2 or page_indices_BP.shape[0] != B:
        raise ValueError(
            f"lengths {lengths_B.shape} and page indices {page_indices_BP.shape} must be [B] and "
            f"[B, pages_per_seq] with B={B}"
        )


def _dims(q_BHD, k_pages_KNSD, v_pages_KNSD, lengths_B, page_indices_BP) -> tuple[int, ...]:
    """``(B, H, D, K, S, P, G)`` of checked arguments: sequences, query heads, head dim, kv heads,
    page size, pages per sequence, query heads per kv head."""
    _check_shapes(q_BHD, k_pages_KNSD, v_pages_KNSD, lengths_B, page_indices_BP)
    B, H, D = q_BHD.shape
    K, _, S, _ = k_pages_KNSD.shape
    return B, H, D, K, S, page_indices_BP.shape[1], H // K


def _live_pages(lengths_B: jax.Array, S: int, P: int) -> jax.Array:
    """Pages that hold a token of the longest sequence: how far a page loop must go."""
    return jnp.minimum((jnp.max(lengths_B) + S - 1) // S, P)


def _page(k_pages_KNSD, v_pages_KNSD, lengths_B, page_indices_BP, p):
    """Logical page ``p`` of every sequence: keys and values ``[B, K, S, D]`` and which of its
    slots hold a cached token ``[B, S]``. Values are zero in the other slots: unwritten slots may
    hold anything (NaN included), and no query sees them."""
    S = k_pages_KNSD.shape[2]
    pages_B = page_indices_BP[:, p]
    k_BKSD = jnp.moveaxis(k_pages_KNSD[:, pages_B], 0, 1)
    v_BKSD = jnp.moveaxis(v_pages_KNSD[:, pages_B], 0, 1)
    valid_BS = p * S + jnp.arange(S)[None, :] < lengths_B[:, None]
    return k_BKSD, jnp.where(valid_BS[:, None, :, None], v_BKSD, jnp.zeros((), v_BKSD.dtype)), valid_BS


def paged_attention_reference(
    q_BHD: jax.Array,
    k_pages_KNSD: jax.Array,
    v_pages_KNSD: jax.Array,
    lengths_B: jax.Array,
    page_indices_BP: jax.Array,
    *,
    scale: float,
) -> jax.Array:
    """Pure ``jnp`` paged attention: gather pages, dense masked softmax in float32."""
    B, H, D, K, S, P, G = _dims(q_BHD, k_pages_KNSD, v_pages_KNSD, lengths_B, page_indices_BP)
    # [K, B, P, S, D] -> [B, K, P*S, D]: the sequence's cached tokens in logical order.
    k_BKLD = jnp.moveaxis(k_pages_KNSD[:, page_indices_BP], 0, 1).reshape(B, K, P * S, D)
    v_BKLD = jnp.moveaxis(v_pages_KNSD[:, page_indices_BP], 0, 1).reshape(B, K, P * S, D)
    q_BKGD = q_BHD.reshape(B, K, G, D)
    scores_BKGL = jnp.einsum(
        "bkgd,bkld->bkgl", q_BKGD, k_BKLD, preferred_element_type=jnp.float32
    ) * jnp.float32(scale)
    valid_BL = jnp.arange(P * S)[None, :] < lengths_B[:, None]
    valid_BKGL = valid_BL[:, None, None, :]
    scores_BKGL = jnp.where(valid_BKGL, scores_BKGL, -jnp.inf)
    max_BKG1 = jnp.max(scores_BKGL, axis=-1, keepdims=True)
    max_BKG1 = jnp.where(jnp.isfinite(max_BKG1), max_BKG1, 0.0)
    weights_BKGL = jnp.where(valid_BKGL, jnp.exp(scores_BKGL - max_BKG1), 0.0)
    denom_BKG1 = jnp.sum(weights_BKGL, axis=-1, keepdims=True)
    v_BKLD = jnp.where(valid_BL[:, None, :, None], v_BKLD, jnp.zeros((), v_BKLD.dtype))
    out_BKGD = jnp.einsum(
        "bkgl,bkld->bkgd",
        weights_BKGL,
        v_BKLD.astype(jnp.float32),
        preferred_element_type=jnp.float32,
    )
    out_BKGD = out_BKGD / jnp.where(denom_BKG1 > 0, denom_BKG1, 1.0)
    return out_BKGD.reshape(B, H, D).astype(q_BHD.dtype)


def paged_attention_live(
    q_BHD: jax.Array,
    k_pages_KNSD: jax.Array,
    v_pages_KNSD: jax.Array,
    lengths_B: jax.Array,
    page_indices_BP: jax.Array,
    *,
    scale: float,
) -> jax.Array:
    """Pure ``jnp`` paged attention over the live pages: an online softmax, page by page."""
    B, H, D, K, S, P, G = _dims(q_BHD, k_pages_KNSD, v_pages_KNSD, lengths_B, page_indices_BP)
    q_BKGD = q_BHD.reshape(B, K, G, D)
    lengths_B = lengths_B.astype(jnp.int32)

    def page(p, state):
        max_BKG1, denom_BKG1, acc_BKGD = state
        k_BKSD, v_BKSD, valid_BS = _page(k_pages_KNSD, v_pages_KNSD, lengths_B, page_indices_BP, p)
        valid_BKGS = valid_BS[:, None, None, :]
        scores_BKGS = jnp.einsum(
            "bkgd,bksd->bkgs", q_BKGD, k_BKSD, preferred_element_type=jnp.float32
        ) * jnp.float32(scale)
        scores_BKGS = jnp.where(valid_BKGS, scores_BKGS, -jnp.inf)
        new_max_BKG1 = jnp.maximum(max_BKG1, jnp.max(scores_BKGS, axis=-1, keepdims=True))
        # Rows with no valid slot on this page keep their state (selected below): their new
        # maximum may be -inf, and -inf - -inf is NaN.
        live_B1111 = (p * S < lengths_B)[:, None, None, None]
        new_max_BKG1 = jnp.where(live_B1111, new_max_BKG1, 0.0)
        rescale_BKG1 = jnp.exp(max_BKG1 - new_max_BKG1)
        weights_BKGS = jnp.where(valid_BKGS, jnp.exp(scores_BKGS - new_max_BKG1), 0.0)
        denom = rescale_BKG1 * denom_BKG1 + jnp.sum(weights_BKGS, axis=-1, keepdims=True)
        acc = rescale_BKG1 * acc_BKGD + jnp.einsum(
            "bkgs,bksd->bkgd", weights_BKGS, v_BKSD.astype(jnp.float32),
            preferred_element_type=jnp.float32,
        )
        return (
            jnp.where(live_B1111, new_max_BKG1, max_BKG1),
            jnp.where(live_B1111, denom, denom_BKG1),
            jnp.where(live_B1111, acc, acc_BKGD),
        )

    state = (
        jnp.full((B, K, G, 1), -jnp.inf, jnp.float32),
        jnp.zeros((B, K, G, 1), jnp.float32),
        jnp.zeros((B, K, G, D), jnp.float32),
    )
    _, denom_BKG1, acc_BKGD = jax.lax.fori_loop(0, _live_pages(lengths_B, S, P), page, state)
    out_BKGD = acc_BKGD / jnp.where(denom_BKG1 > 0, denom_BKG1, 1.0)
    return out_BKGD.reshape(B, H, D).astype(q_BHD.dtype)


def paged_attention_ordered(
    q_BHD: jax.Array,
    k_pages_KNSD: jax.Array,
    v_pages_KNSD: jax.Array,
    lengths_B: jax.Array,
    page_indices_BP: jax.Array,
    *,
    scale: float,
) -> jax.Array:
    """``paged_attention_live``'s pages with ``kernels.ordered_attention.block_step``: the bits
    ``ordered_attention`` gives the same query over the same keys in a row whose blocks are these
    pages."""
    B, H, D, K, S, P, G = _dims(q_BHD, k_pages_KNSD, v_pages_KNSD, lengths_B, page_indices_BP)
    q_BKGD = q_BHD.reshape(B, K, G, D)
    lengths_B = lengths_B.astype(jnp.int32)

    def page(p, state):
        k_BKSD, v_BKSD, valid_BS = _page(k_pages_KNSD, v_pages_KNSD, lengths_B, page_indices_BP, p)
        return block_step(state, q_BKGD, k_BKSD, v_BKSD, valid_BS[:, None, None, :], scale=scale)

    state = jax.lax.fori_loop(0, _live_pages(lengths_B, S, P), page, initial_state((B, K, G), D))
    return finish(state).reshape(B, H, D).astype(q_BHD.dtype)


def _paged_attention_kernel(
    lengths_ref,
    page_indices_ref,
    q_ref,
    k_ref,
    v_ref,
    out_ref,
    max_ref,
    denom_ref,
    acc_ref,
    *,
    scale: float,
    page_size: int,
    pages_per_seq: int,
):
    """One (sequence, kv head, logical page) step of the online softmax."""
    del page_indices_ref  # used by the index maps only
    b = pl.program_id(0)
    p = pl.program_id(2)
    length = lengths_ref[b]

    @pl.when(p == 0)
    def _init():
        max_ref[...] = jnp.full(max_ref.shape, -jnp.inf, jnp.float32)
        denom_ref[...] = jnp.zeros(denom_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    @pl.when(p * page_size < length)
    def _accumulate():
        q_GD = q_ref[...].astype(jnp.float32)
        k_SD = k_ref[...].astype(jnp.float32)
        v_SD = v_ref[...].astype(jnp.float32)
        pos_1S = p * page_size + jax.lax.broadcasted_iota(jnp.int32, (1, page_size), 1)
        valid_1S = pos_1S < length
        scores_GS = jax.lax.dot_general(
            q_GD, k_SD, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
        ) * jnp.float32(scale)
        scores_GS = jnp.where(valid_1S, scores_GS, -jnp.inf)
        prev_max_G1 = max_ref[...]
        # At least one slot of this page is valid, so the new maximum is finite.
        new_max_G1 = jnp.maximum(prev_max_G1, jnp.max(scores_GS, axis=1, keepdims=True))
        rescale_G1 = jnp.exp(prev_max_G1 - new_max_G1)
        weights_GS = jnp.where(valid_1S, jnp.exp(scores_GS - new_max_G1), 0.0)
        v_SD = jnp.where(valid_1S.reshape(page_size, 1), v_SD, 0.0)
        denom_ref[...] = rescale_G1 * denom_ref[...] + jnp.sum(weights_GS, axis=1, keepdims=True)
        acc_ref[...] = rescale_G1 * acc_ref[...] + jax.lax.dot_general(
            weights_GS, v_SD, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
        )
        max_ref[...] = new_max_G1

    @pl.when(p == pages_per_seq - 1)
    def _finish():
        denom_G1 = denom_ref[...]
        out_GD = acc_ref[...] / jnp.where(denom_G1 > 0, denom_G1, 1.0)
        out_ref[...] = out_GD.astype(out_ref.dtype)


@functools.partial(jax.jit, static_argnames=("scale", "interpret"))
def paged_attention_pallas(
    q_BHD: jax.Array,
    k_pages_KNSD: jax.Array,
    v_pages_KNSD: jax.Array,
    lengths_B: jax.Array,
    page_indices_BP: jax.Array,
    *,
    scale: float,
    interpret: bool = False,
) -> jax.Array:
    """The Pallas TPU kernel; ``interpret=True`` runs it on any backend (slow, for tests)."""
    B, H, D, K, S, P, G = _dims(q_BHD, k_pages_KNSD, v_pages_KNSD, lengths_B, page_indices_BP)

    def page_map(b, k, p, lengths_ref, page_indices_ref):
        # Past the last valid page, repeat it: the block index does not change, so no page is
        # fetched for nothing, and padding entries of the page table are never dereferenced.
        last = jnp.maximum((lengths_ref[b] + S - 1) // S - 1, 0)
        return k, page_indices_ref[b, jnp.minimum(p, last)], 0, 0

    def head_map(b, k, p, lengths_ref, page_indices_ref):
        return b, k, 0, 0

    kernel = functools.partial(_paged_attention_kernel, scale=scale, page_size=S, pages_per_seq=P)
    out_BKGD = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((B, K, G, D), q_BHD.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(B, K, P),
            in_specs=[
                pl.BlockSpec((None, None, G, D), head_map),
                pl.BlockSpec((None, None, S, D), page_map),
                pl.BlockSpec((None, None, S, D), page_map),
            ],
            out_specs=pl.BlockSpec((None, None, G, D), head_map),
            scratch_shapes=[
                pltpu.VMEM((G, 1), jnp.float32),
                pltpu.VMEM((G, 1), jnp.float32),
                pltpu.VMEM((G, D), jnp.float32),
            ],
        ),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")
        ),
        interpret=pltpu.InterpretParams() if interpret else False,
        name="rlx_paged_attention",
    )(
        lengths_B.astype(jnp.int32),
        page_indices_BP.astype(jnp.int32),
        q_BHD.reshape(B, K, G, D),
        k_pages_KNSD,
        v_pages_KNSD,
    )
    return out_BKGD.reshape(B, H, D)
