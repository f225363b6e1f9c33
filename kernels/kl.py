"""KL estimators between the policy and the reference model, and their two placements.

With ``d = ℓ_ref - ℓ`` per sampled token (Schulman's estimators of ``KL(π_θ ‖ π_ref)``):

==========  ======================  =====================
estimator   value                   ``∂/∂ℓ``
==========  ======================  =====================
k1          ``ℓ - ℓ_ref = -d``      ``1``
k2          ``½ (ℓ - ℓ_ref)²``      ``ℓ - ℓ_ref``
k3          ``e^d - d - 1 ≥ 0``     ``1 - e^d``
==========  ======================  =====================

k3 (VERL ``low_var_kl``) is unbiased with low variance and never negative. ``d`` is clamped to
``[-20, 20]`` before the exponential, as VERL does, so that a wild log-prob cannot overflow.

Placement: *in the loss* (the GRPO family) the objective adds ``β·Agg(KL)`` evaluated at the
current parameters, with its gradient (see :mod:`kernels.objectives`). *In the reward* (PPO,
RLOO) the KL of the behaviour policy is subtracted from the rewards before advantages are
estimated and carries no gradient: :func:`kl_penalized_rewards`, :func:`sequence_kl`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.dtypes import float_dtype
from kernels.errors import reject

KL_ESTIMATORS = ("k1", "k2", "k3")

_LOG_RATIO_BOUND = 20.0


def token_kl(
    logp_BT: jax.Array,
    logp_ref_BT: jax.Array,
    estimator: str,
    *,
    mask_BT: jax.Array | None = None,
) -> jax.Array:
    """Per-token KL estimate; 0 (value and gradient) on masked positions.

    Args:
      logp_BT: log-probs of the sampled tokens under the policy.
      logp_ref_BT: the same under the reference model.
      estimator: one of :data:`KL_ESTIMATORS`.
      mask_BT: positions that count; others may hold NaN or Inf.

    Returns:
      ``[B, T]`` estimates in the promoted floating dtype of the inputs.
    """
    if estimator not in KL_ESTIMATORS:
        raise reject("KL estimator", estimator, KL_ESTIMATORS)
    dtype = float_dtype(logp_BT, logp_ref_BT)
    logp_BT = jnp.asarray(logp_BT, dtype)
    logp_ref_BT = jnp.asarray(logp_ref_BT, dtype)
    if mask_BT is not None:
        mask_BT = jnp.asarray(mask_BT, bool)
        logp_BT = jnp.where(mask_BT, logp_BT, 0.0)
        logp_ref_BT = jnp.where(mask_BT, logp_ref_BT, 0.0)
    delta_BT = logp_ref_BT - logp_BT
    if estimator == "k1":
        kl_BT = -delta_BT
    elif estimator == "k2":
        kl_BT = 0.5 * jnp.square(delta_BT)
    else:
        bounded_BT = jnp.clip(delta_BT, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
        # expm1 keeps the precision of e^d - 1 for d near 0, where k3 ≈ d²/2 is tiny.
        kl_BT = jnp.expm1(bounded_BT) - bounded_BT
    if mask_BT is not None:
        kl_BT = jnp.where(mask_BT, kl_BT, 0.0)
    return kl_BT


def sequence_kl(
    logp_BT: jax.Array, logp_ref_BT: jax.Array, mask_BT: jax.Array, estimator: str = "k1"
) -> jax.Array:
    """Per-sequence KL, the masked token sum; constant (no gradient), for rewards. ``[B]``."""
    kl_BT = token_kl(logp_BT, logp_ref_BT, estimator, mask_BT=mask_BT)
    return jax.lax.stop_gradient(jnp.sum(kl_BT, axis=1))


def kl_penalized_rewards(
    token_rewards_BT: jax.Array,
    logp_old_BT: jax.Array,
    logp_ref_BT: jax.Array,
    mask_BT: jax.Array,
    *,
    coef: float,
    estimator: str = "k1",
) -> jax.Array:
    """KL in the reward: ``r_t - β·KL_t`` from behaviour log-probs, without gradient.

    Returns:
      ``[B, T]`` shaped token rewards, 0 on masked positions.
    """
    mask_BT = jnp.asarray(mask_BT, bool)
    kl_BT = token_kl(logp_old_BT, logp_ref_BT, estimator, mask_BT=mask_BT)
    shaped_BT = jnp.where(mask_BT, token_rewards_BT - coef * kl_BT, 0.0)
    return jax.lax.stop_gradient(shaped_BT)
