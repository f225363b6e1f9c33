"""Advantage estimators: group baselines for outcome rewards, and GAE with whitening for PPO.

Outcome-reward estimators map the rewards of ``M`` prompts × ``G`` responses to one advantage
per response (broadcast to its tokens by the loss):

==========  ===================================================  ================================
estimator   ``Â_i``                                              source
==========  ===================================================  ================================
reinforce   ``R_i - b`` (``b = 0`` without a baseline)           Williams 1992
grpo        ``(R_i - mean_g R) / (std_g R + ε_A)``, ddof = 1      DeepSeekMath; VERL, TRL, TUNIX
drgrpo      ``R_i - mean_g R``                                   Dr. GRPO
rloo        ``R_i - Σ_{j≠i} R_j / (G-1) = G/(G-1)·(R_i - R̄)``   RLOO (Ahmadian et al. 2024)
gae         token-level, from values: :func:`gae_advantages`     Schulman et al. 2016; PPO
==========  ===================================================  ================================

A group whose rewards are all equal carries no signal; every group estimator gives it exactly 0.
``ε_A`` defaults to 1e-6 (VERL, TUNIX; TRL uses 1e-4).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.dtypes import float_dtype
from kernels.errors import ObjectiveConfigError, reject

ESTIMATORS = ("reinforce", "grpo", "drgrpo", "rloo", "gae")
GROUP_ESTIMATORS = ("reinforce", "grpo", "drgrpo", "rloo")

WHITEN_EPS = 1e-8


def group_advantages(
    rewards_MG: jax.Array,
    estimator: str,
    *,
    eps: float = 1e-6,
    baseline: jax.Array | float | None = None,
) -> jax.Array:
    """Advantages of ``G`` responses to each of ``M`` prompts.

    Args:
      rewards_MG: scalar reward of every response, one row per prompt.
      estimator: one of :data:`GROUP_ESTIMATORS`.
      eps: ``ε_A`` added to the group std (``grpo`` only).
      baseline: ``b`` for ``reinforce``, broadcastable to ``[M, G]``; None for no baseline.

    Returns:
      ``[M, G]`` advantages in the promoted floating dtype of the rewards.
    """
    if estimator == "gae":
        raise ObjectiveConfigError(
            "estimator 'gae' works on token rewards and values: use gae_advantages; "
            f"group_advantages accepts: {', '.join(GROUP_ESTIMATORS)}"
        )
    if estimator not in GROUP_ESTIMATORS:
        raise reject("advantage estimator", estimator, ESTIMATORS)
    if baseline is not None and estimator != "reinforce":
        raise ObjectiveConfigError(
            f"a baseline is only taken by estimator 'reinforce', not {estimator!r}"
        )
    rewards_MG = jnp.asarray(rewards_MG)
    rewards_MG = rewards_MG.astype(float_dtype(rewards_MG))
    if rewards_MG.ndim != 2:
        raise ObjectiveConfigError(
            f"rewards must have shape [M, G] (prompts × responses), got {rewards_MG.shape}"
        )
    if estimator == "reinforce":
        return rewards_MG if baseline is None else rewards_MG - baseline
    group_size = rewards_MG.shape[1]
    if group_size < 2:
        raise ObjectiveConfigError(
            f"estimator {estimator!r} needs groups of at least 2 responses, got G={group_size}"
        )
    centered_MG = rewards_MG - jnp.mean(rewards_MG, axis=1, keepdims=True)
    if estimator == "grpo":
        std_M1 = jnp.std(rewards_MG, axis=1, keepdims=True, ddof=1)
        advantages_MG = centered_MG / (std_M1 + eps)
    elif estimator == "drgrpo":
        advantages_MG = centered_MG
    else:
        advantages_MG = centered_MG * (group_size / (group_size - 1))
    # The mean of equal floats need not round back to them; state "no signal" exactly.
    constant_M1 = jnp.max(rewards_MG, axis=1, keepdims=True) == jnp.min(
        rewards_MG, axis=1, keepdims=True
    )
    return jnp.where(constant_M1, 0.0, advantages_MG)


def token_rewards(
    scores_B: jax.Array, mask_BT: jax.Array, *, penalty_BT: jax.Array | None = None
) -> jax.Array:
    """Token rewards for PPO: the sequence score at the last valid token, minus a penalty.

    Args:
      scores_B: outcome score of every response.
      mask_BT: response mask (rows may be empty).
      penalty_BT: per-token penalty to subtract, e.g. ``β·KL`` from :mod:`kernels.kl`.

    Returns:
      ``[B, T]`` rewards, 0 on masked positions.
    """
    mask_BT = jnp.asarray(mask_BT, bool)
    _, width = mask_BT.shape
    positions_BT = jnp.arange(width)[None, :]
    last_B = jnp.max(jnp.where(mask_BT, positions_BT, -1), axis=1)
    rewards_BT = jnp.where(positions_BT == last_B[:, None], scores_B[:, None], 0.0)
    if penalty_BT is not None:
        rewards_BT = rewards_BT - jnp.where(mask_BT, penalty_BT, 0.0)
    return jnp.where(mask_BT, rewards_BT, 0.0)


def gae_advantages(
    rewards_BT: jax.Array,
    values_BT: jax.Array,
    mask_BT: jax.Array,
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation that skips masked positions.

    Backwards over ``t``: ``δ_t = r_t + γ V_{t+1} - V_t`` and ``A_t = δ_t + γλ A_{t+1}``, where
    ``t+1`` is the next *unmasked* position (VERL's recursion), so padding and observation tokens
    inside a row change nothing. The value after a row's last valid token is 0.

    Args:
      rewards_BT: token rewards (see :func:`token_rewards`).
      values_BT: value estimates of the behaviour policy's critic.
      mask_BT: positions that count; others may hold NaN or Inf.
      gamma: discount ``γ``.
      lam: GAE ``λ``.

    Returns:
      ``(advantages_BT, returns_BT)``: raw advantages and returns ``A + V``, 0 where masked.
    """
    mask_BT = jnp.asarray(mask_BT, bool)
    dtype = float_dtype(rewards_BT, values_BT)
    rewards_BT = jnp.where(mask_BT, rewards_BT, 0.0).astype(dtype)
    values_BT = jnp.where(mask_BT, values_BT, 0.0).astype(dtype)
    return _gae_scan(rewards_BT, values_BT, mask_BT, jnp.asarray(gamma, dtype),
                     jnp.asarray(lam, dtype))


@jax.jit
def _gae_scan(rewards_BT, values_BT, mask_BT, gamma, lam):
    """The masked backward recursion; γ and λ are traced so that new values do not recompile."""

    def step(carry, column):
        next_value_B, next_advantage_B = carry
        reward_B, value_B, valid_B = column
        delta_B = reward_B + gamma * next_value_B - value_B
        advantage_B = delta_B + gamma * lam * next_advantage_B
        carry = (
            jnp.where(valid_B, value_B, next_value_B),
            jnp.where(valid_B, advantage_B, next_advantage_B),
        )
        return carry, jnp.where(valid_B, advantage_B, 0.0)

    zeros_B = jnp.zeros(mask_BT.shape[0], rewards_BT.dtype)
    _, advantages_TB = jax.lax.scan(
        step, (zeros_B, zeros_B), (rewards_BT.T, values_BT.T, mask_BT.T), reverse=True
    )
    advantages_BT = advantages_TB.T
    returns_BT = jnp.where(mask_BT, advantages_BT + values_BT, 0.0)
    return advantages_BT, returns_BT


def whiten(values_BT: jax.Array, mask_BT: jax.Array, *, eps: float = WHITEN_EPS) -> jax.Array:
    """``(x - μ) / sqrt(σ² + eps)`` over unmasked positions, σ² unbiased; 0 where masked."""
    mask_BT = jnp.asarray(mask_BT, bool)
    count = jnp.sum(mask_BT).astype(values_BT.dtype)
    mean = jnp.sum(jnp.where(mask_BT, values_BT, 0.0)) / jnp.maximum(count, 1.0)
    centered_BT = jnp.where(mask_BT, values_BT - mean, 0.0)
    variance = jnp.sum(jnp.square(centered_BT)) / jnp.maximum(count - 1.0, 1.0)
    return centered_BT * jax.lax.rsqrt(variance + eps)
