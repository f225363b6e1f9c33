"""Writing new keys and values into a paged KV cache (prefill and decode).

Token ``t`` of sequence ``b`` at position ``pos = positions_BT[b, t]`` lives in physical page
``page_indices_BP[b, pos // page_size]`` at slot ``pos % page_size`` (layout: see
``kernels.paged_attention``). Tokens whose ``valid_BT`` entry is false (bucket padding, empty decode
slots) are not written anywhere: their scatter index points past the last page and the scatter
drops it, so no page, not even the null page, is touched.

Distinct valid tokens must map to distinct (page, slot) pairs (the page allocator's job); the
scatter then has no duplicate indices and its result is deterministic.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def page_slots(
    positions_BT: jax.Array,
    page_indices_BP: jax.Array,
    valid_BT: jax.Array,
    *,
    page_size: int,
    total_pages: int,
) -> tuple[jax.Array, jax.Array]:
    """Physical ``(page_BT, slot_BT)`` of each token; invalid tokens get page ``total_pages``."""
    P = page_indices_BP.shape[1]
    logical_BT = jnp.clip(positions_BT // page_size, 0, P - 1)
    page_BT = jnp.take_along_axis(page_indices_BP, logical_BT, axis=1)
    in_range_BT = (positions_BT >= 0) & (positions_BT < P * page_size)
    page_BT = jnp.where(valid_BT & in_range_BT, page_BT, total_pages)
    return page_BT.astype(jnp.int32), (positions_BT % page_size).astype(jnp.int32)


def write_pages(
    pages_KNSD: jax.Array,
    new_BTKD: jax.Array,
    positions_BT: jax.Array,
    page_indices_BP: jax.Array,
    valid_BT: jax.Array,
) -> jax.Array:
    """Scatter ``new_BTKD`` (keys or values of ``T`` new tokens per sequence) into the pages.

    Args:
      pages_KNSD: ``[num_kv_heads, total_pages, page_size, head_dim]``.
      new_BTKD: ``[B, T, num_kv_heads, head_dim]``, cast to the cache dtype.
      positions_BT: int32 position of each new token in its sequence.
      page_indices_BP: int32 ``[B, pages_per_seq]`` page table.
      valid_BT: bool, which tokens to write.

    Returns:
      The updated pages (in place when the caller donates ``pages_KNSD`` under ``jit``).
    """
    pages_KNSD = jnp.asarray(pages_KNSD)
    K, N, S, D = pages_KNSD.shape
    page_BT, slot_BT = page_slots(
        positions_BT, page_indices_BP, valid_BT, page_size=S, total_pages=N
    )
    new_KBTD = jnp.moveaxis(new_BTKD, 2, 0).astype(pages_KNSD.dtype)
    return pages_KNSD.at[:, page_BT, slot_BT].set(new_KBTD, mode="drop")
