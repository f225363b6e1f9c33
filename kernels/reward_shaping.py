"""DAPO's reward-side components: dynamic sampling and soft overlong punishment.

Both act on rewards *before* advantages and loss normalisers are computed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.errors import ObjectiveConfigError


def dynamic_sampling_keep(metric_MG: jax.Array) -> jax.Array:
    """Which prompt groups DAPO's dynamic sampling keeps: ``[M]`` booleans.

    A group is kept iff its filter metric (accuracy by default, or the sequence reward) is not
    constant across its ``G`` responses, or it has a single response (VERL's DAPO recipe keeps
    ``std > 0 or G == 1``). A constant group has all-zero group advantages and so no gradient;
    the sampler draws more prompts until the batch is full of kept groups. Equality is tested
    exactly (max == min) rather than through a floating-point std.
    """
    metric_MG = jnp.asarray(metric_MG)
    if metric_MG.ndim != 2:
        raise ObjectiveConfigError(
            f"the filter metric must have shape [M, G] (prompts × responses), got {metric_MG.shape}"
        )
    if metric_MG.shape[1] == 1:
        return jnp.ones(metric_MG.shape[0], bool)
    return jnp.max(metric_MG, axis=1) != jnp.min(metric_MG, axis=1)


def overlong_penalty(
    lengths_B: jax.Array, *, max_length: int, buffer_length: int, capped: bool = True
) -> jax.Array:
    """Soft overlong punishment ``R_length(|y|)``, added to the task reward.

    ``R_length = 0`` for ``|y| ≤ L_max - L_cache``, ``((L_max - L_cache) - |y|) / L_cache`` up to
    ``L_max``, and ``-1`` beyond (DAPO Eq. 13, TRL). ``capped=False`` gives VERL's form, which
    keeps falling past ``L_max`` (unreachable there, as VERL truncates at ``L_max``).

    Args:
      lengths_B: response lengths in tokens.
      max_length: ``L_max``, the configured maximum response length.
      buffer_length: ``L_cache``, the length of the punishment ramp, ``0 < L_cache ≤ L_max``.
      capped: clamp the penalty at -1.

    Returns:
      ``[B]`` penalties in ``[-1, 0]`` (``capped``) as float32.
    """
    if not 0 < buffer_length <= max_length:
        raise ObjectiveConfigError(
            f"overlong buffer_length must be in (0, max_length={max_length}], got {buffer_length}"
        )
    lengths_B = jnp.asarray(lengths_B, jnp.float32)
    threshold = max_length - buffer_length
    # XLA may divide through a reciprocal; pin the end points of the ramp exactly.
    ramp_B = jnp.where(lengths_B == max_length, -1.0, (threshold - lengths_B) / buffer_length)
    penalty_B = jnp.where(lengths_B <= threshold, 0.0, ramp_B)
    return jnp.maximum(penalty_B, -1.0) if capped else penalty_B
