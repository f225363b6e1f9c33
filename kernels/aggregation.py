"""Aggregation of per-token losses into one scalar, with normalisers that survive sharding.

Every mode is a weighted sum ``L = Σ_{i,t} m_{i,t} w_{i,t} L_{i,t}`` whose weight is constant
along a row:

=====================  ==============================  =========================================
mode                   weight ``w_{i,t}``              known elsewhere as
=====================  ==============================  =========================================
seq_mean_token_mean    ``1 / (N_seq |o_i|)``           GRPO paper; VERL ``seq-mean-token-mean``
batch_token_mean       ``1 / Σ_batch |o_j|``           VERL ``token-mean``; TRL ``dapo``
group_token_mean       ``1 / (M Σ_{j∈g(i)} |o_j|)``    the DAPO paper's per-prompt token mean
seq_mean_token_sum     ``1 / N_seq``                   REINFORCE / RLOO sequence losses
max_length_mean        ``1 / (N_seq L_max)``           Dr. GRPO; TRL ``dr_grpo``
=====================  ==============================  =========================================

``|o_i|`` is the number of unmasked tokens of row ``i``, ``N_seq`` the number of rows with at
least one, ``M`` the number of groups with at least one. ``L_max`` is the configured maximum
response length, a constant: deriving it from the padded width would make the loss depend on
how a batch happens to be padded.

``N_seq``, ``Σ|o|`` and ``M`` are *global* quantities. When a batch is split over data-parallel
shards or gradient-accumulation micro-batches, compute :class:`Totals` for every piece with
:func:`batch_totals`, add them (``jax.tree.map(jnp.add, ...)`` or ``jax.lax.psum``) and pass the
sum to every piece; the summed gradients then equal the full batch's. Row and group token counts
stay local, so a group must not be split across pieces.

Masked positions may hold NaN or Inf: they are selected away with ``jnp.where`` (never multiplied
by a zero mask), so they reach neither the value nor the gradient.
"""

from __future__ import annotations

import dataclasses
from typing import cast

import jax
import jax.numpy as jnp

from kernels.errors import ObjectiveConfigError, reject

AGGREGATIONS = (
    "seq_mean_token_mean",
    "batch_token_mean",
    "group_token_mean",
    "seq_mean_token_sum",
    "max_length_mean",
)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Totals:
    """Batch-wide normalisers; add the totals of all shards to get the global ones.

    Attributes:
      num_sequences: rows with at least one unmasked token (``N_seq``).
      num_tokens: unmasked tokens (``Σ|o|``).
      num_groups: groups with at least one unmasked token (``M``); 0 when no group size is known.
    """

    num_sequences: jax.Array
    num_tokens: jax.Array
    num_groups: jax.Array


def _group_lengths(lengths_B: jax.Array, group_size: int | None) -> jax.Array:
    if group_size is None:
        raise ObjectiveConfigError(
            "aggregation 'group_token_mean' needs group_size, the number of responses per prompt"
        )
    (num_rows,) = lengths_B.shape
    if group_size < 1 or num_rows % group_size:
        raise ObjectiveConfigError(
            f"group_size {group_size} does not divide the {num_rows} rows of the batch"
        )
    return lengths_B.reshape(num_rows // group_size, group_size).sum(axis=1)


def batch_totals(mask_BT: jax.Array, *, group_size: int | None = None) -> Totals:
    """Counts the normalisers of one (piece of a) batch; rows of a group must be contiguous.

    Pass the same ``group_size`` as the loss will use: without it ``num_groups`` stays 0 and
    ``group_token_mean`` would weigh every token by 0.
    """
    lengths_B = jnp.sum(jnp.asarray(mask_BT, bool), axis=1, dtype=jnp.int32)
    num_groups = jnp.zeros((), jnp.int32)
    if group_size is not None:
        num_groups = jnp.sum(_group_lengths(lengths_B, group_size) > 0, dtype=jnp.int32)
    return Totals(
        num_sequences=jnp.sum(lengths_B > 0, dtype=jnp.int32),
        num_tokens=jnp.sum(lengths_B, dtype=jnp.int32),
        num_groups=num_groups,
    )


def _inverse(count: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """``1 / count`` where ``count > 0``, else 0, with no division by zero anywhere."""
    count = count.astype(dtype)
    return jnp.where(count > 0, 1.0 / jnp.maximum(count, 1.0), 0.0)


def token_weights(
    mask_BT: jax.Array,
    mode: str,
    *,
    totals: Totals | None = None,
    max_length: int | None = None,
    group_size: int | None = None,
    dtype: jnp.dtype = jnp.float32,
) -> jax.Array:
    """The weight ``w_{i,t}`` of every token under ``mode``; 0 on masked positions.

    Args:
      mask_BT: 1 (or True) on tokens that enter the loss.
      mode: one of :data:`AGGREGATIONS`.
      totals: global normalisers; computed from ``mask_BT`` alone when omitted.
      max_length: ``L_max`` for ``max_length_mean``; a configuration constant.
      group_size: responses per prompt for ``group_token_mean`` (rows of a group contiguous).
      dtype: floating dtype of the weights.

    Returns:
      ``[B, T]`` weights.
    """
    if mode not in AGGREGATIONS:
        raise reject("aggregation", mode, AGGREGATIONS)
    mask_BT = jnp.asarray(mask_BT, bool)
    if totals is None:
        totals = batch_totals(
            mask_BT, group_size=group_size if mode == "group_token_mean" else None
        )
    lengths_B = jnp.sum(mask_BT, axis=1, dtype=jnp.int32)
    per_sequence = _inverse(totals.num_sequences, dtype)
    if mode == "seq_mean_token_mean":
        row_B = per_sequence * _inverse(lengths_B, dtype)
    elif mode == "batch_token_mean":
        row_B = jnp.broadcast_to(_inverse(totals.num_tokens, dtype), lengths_B.shape)
    elif mode == "group_token_mean":
        group_M = _inverse(totals.num_groups, dtype) * _inverse(
            _group_lengths(lengths_B, group_size), dtype  # refuses a missing group_size
        )
        row_B = jnp.repeat(group_M, cast(int, group_size))
    elif mode == "seq_mean_token_sum":
        row_B = jnp.broadcast_to(per_sequence, lengths_B.shape)
    else:
        if max_length is None or max_length < 1:
            raise ObjectiveConfigError(
                f"aggregation 'max_length_mean' needs max_length >= 1, the configured maximum "
                f"response length (a constant, never the padded width); got {max_length!r}"
            )
        row_B = jnp.broadcast_to(per_sequence / max_length, lengths_B.shape)
    return jnp.where(mask_BT, row_B[:, None], 0.0).astype(dtype)


def aggregate(values_BT: jax.Array, mask_BT: jax.Array, mode: str, **weight_options) -> jax.Array:
    """``Σ_{i,t} m_{i,t} w_{i,t} x_{i,t}`` under ``mode``; see :func:`token_weights`."""
    mask_BT = jnp.asarray(mask_BT, bool)
    weights_BT = token_weights(mask_BT, mode, dtype=values_BT.dtype, **weight_options)
    return jnp.sum(jnp.where(mask_BT, weights_BT * values_BT, 0.0))


def masked_mean(values_BT: jax.Array, mask_BT: jax.Array) -> jax.Array:
    """Plain mean over unmasked positions (0 when there are none); for metrics."""
    mask_BT = jnp.asarray(mask_BT, bool)
    total = jnp.sum(jnp.where(mask_BT, values_BT, 0.0))
    return total / jnp.maximum(jnp.sum(mask_BT), 1).astype(total.dtype)
