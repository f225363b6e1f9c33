"""PPO's clipped value loss."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.aggregation import Totals, aggregate
from kernels.dtypes import float_dtype


def value_loss(
    values_BT: jax.Array,
    values_old_BT: jax.Array,
    returns_BT: jax.Array,
    mask_BT: jax.Array,
    *,
    clip: float = 0.2,
    aggregation: str = "batch_token_mean",
    totals: Totals | None = None,
    max_length: int | None = None,
    group_size: int | None = None,
) -> jax.Array:
    """Clipped value loss (VERL ``compute_value_loss``, TRL PPO, TUNIX).

    .. math::
        L_V = \\tfrac12\\,\\mathrm{Agg}\\Big(\\max\\big((V - \\hat R)^2,
              (\\mathrm{clip}(V, V^{old} - ε_v, V^{old} + ε_v) - \\hat R)^2\\big)\\Big)

    Args:
      values_BT: current value predictions (differentiated).
      values_old_BT: the critic's predictions when the rollouts were scored.
      returns_BT: ``R̂ = A + V_old`` from :func:`kernels.advantages.gae_advantages`.
      mask_BT: positions that count; others may hold NaN or Inf.
      clip: ``ε_v``.
      aggregation: an aggregation mode of :mod:`kernels.aggregation`.
      totals: global normalisers when the batch is sharded.
      max_length: ``L_max`` for ``max_length_mean``.
      group_size: responses per prompt for ``group_token_mean``.

    Returns:
      The scalar loss in the promoted floating dtype of ``values_BT`` (at least float32).
    """
    mask_BT = jnp.asarray(mask_BT, bool)
    dtype = float_dtype(jnp.asarray(values_BT))
    values_BT = jnp.where(mask_BT, values_BT, 0.0).astype(dtype)
    values_old_BT = jax.lax.stop_gradient(jnp.where(mask_BT, values_old_BT, 0.0).astype(dtype))
    returns_BT = jax.lax.stop_gradient(jnp.where(mask_BT, returns_BT, 0.0).astype(dtype))
    clipped_BT = values_old_BT + jnp.clip(values_BT - values_old_BT, -clip, clip)
    error_BT = jnp.maximum(
        jnp.square(values_BT - returns_BT), jnp.square(clipped_BT - returns_BT)
    )
    return 0.5 * aggregate(
        error_BT, mask_BT, aggregation, totals=totals, max_length=max_length,
        group_size=group_size,
    )
