"""Preference losses (DPO, KTO) in the unified form: ``Agg = 1/N``, ``IS = 1``, ``GT1 = ±ℓ``.

Both losses depend on the policy only through summed sequence log-ratios
``r_θ(x, y) = Σ_t m_t (ℓ_t - ℓ^ref_t)``. Their gradient is ``sg[Adv] ∇ Σ_t ℓ_t`` per sequence,
with the advantage ``Adv = -∂L/∂r_θ`` written out below; the value is the reference loss, attached
by :func:`kernels.surrogate.unified_loss` as in :mod:`kernels.objectives`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from kernels.algorithms import (
    PREFERENCE_ALGORITHMS,
    DPOObjective,
    KTOObjective,
    Objective,
    configure,
)
from kernels.dtypes import float_dtype
from kernels.errors import ObjectiveConfigError
from kernels.surrogate import unified_loss

sg = jax.lax.stop_gradient


def _sequence_sums(logp, logp_ref, mask):
    """``(Σ_t ℓ, Σ_t ℓ_ref)`` per row; the first differentiated, masked slots selected away."""
    mask_BT = jnp.asarray(mask, bool)
    if mask_BT.ndim != 2:
        raise ObjectiveConfigError(f"mask must have shape [B, T], got {mask_BT.shape}")
    logp = jnp.asarray(logp)
    dtype = float_dtype(logp)
    logp_B = jnp.sum(jnp.where(mask_BT, logp, 0.0).astype(dtype), axis=1)
    logp_ref_B = sg(jnp.sum(jnp.where(mask_BT, logp_ref, 0.0).astype(dtype), axis=1))
    return logp_B, logp_ref_B


def _stitch(value, advantage_B, logp_B):
    """``value`` with the gradient of ``-mean_i sg[Adv_i] Σ_t ℓ_{i,t}``."""
    return unified_loss(sg(value), sg(advantage_B) / advantage_B.shape[0], logp_B)


def dpo_loss(config: DPOObjective, logp, logp_ref, mask) -> tuple[jax.Array, dict]:
    """Sigmoid DPO with label smoothing over pairs laid out as ``[chosen; rejected]``.

    .. math::
        Δ = r_θ(x, y^+) - r_θ(x, y^-),\\qquad
        L = \\mathrm{mean}_{pairs}\\big[(1-ε)\\,\\mathrm{softplus}(-βΔ)
                                      + ε\\,\\mathrm{softplus}(βΔ)\\big]

    ``Adv(y^±) = ±β[(1-ε)σ(-βΔ) - εσ(βΔ)]``.
    """
    logp_B, logp_ref_B = _sequence_sums(logp, logp_ref, mask)
    (rows,) = logp_B.shape
    if rows % 2:
        raise ObjectiveConfigError(
            f"DPO takes pairs as [chosen; rejected] rows, so B must be even, got B={rows}"
        )
    log_ratio_B = logp_B - logp_ref_B
    chosen_P, rejected_P = jnp.split(log_ratio_B, 2)
    margin_P = config.beta * (chosen_P - rejected_P)
    eps = config.label_smoothing
    value = jnp.mean((1 - eps) * jax.nn.softplus(-margin_P) + eps * jax.nn.softplus(margin_P))
    advantage_P = config.beta * (
        (1 - eps) * jax.nn.sigmoid(-margin_P) - eps * jax.nn.sigmoid(margin_P)
    )
    # Each pair holds two rows, and the mean over pairs is twice the mean over rows.
    loss = _stitch(value, 2.0 * jnp.concatenate([advantage_P, -advantage_P]), logp_B)
    metrics = dict(
        reward_chosen=sg(config.beta * jnp.mean(chosen_P)),
        reward_rejected=sg(config.beta * jnp.mean(rejected_P)),
        reward_margin=sg(jnp.mean(margin_P)),
        reward_accuracy=sg(jnp.mean((margin_P > 0).astype(margin_P.dtype))),
    )
    return loss, metrics


def kto_reference_point(mismatched_logp, mismatched_logp_ref, mismatched_mask) -> jax.Array:
    """KTO's ``z_0 = max(0, mean_j r_θ(x_j, y'_j))`` over non-empty mismatched pairs; no gradient.

    ``y'_j`` is a completion of another prompt in the batch (TRL shifts completions by one). For
    data-parallel training, average the per-shard sums and counts across shards and pass the
    result to :func:`kto_loss` as ``reference_point``.
    """
    logp_B, logp_ref_B = _sequence_sums(mismatched_logp, mismatched_logp_ref, mismatched_mask)
    nonempty_B = jnp.any(jnp.asarray(mismatched_mask, bool), axis=1)
    total = jnp.sum(jnp.where(nonempty_B, logp_B - logp_ref_B, 0.0))
    mean = total / jnp.maximum(jnp.sum(nonempty_B), 1).astype(total.dtype)
    return sg(jnp.maximum(mean, 0.0))


def kto_loss(config: KTOObjective, logp, logp_ref, mask, desirable, reference_point):
    """KTO over unpaired examples.

    .. math::
        L = \\mathrm{mean}_i \\begin{cases}λ_D\\,(1 - σ(β(r_θ - z_0))) & \\text{desirable}\\\\
                                   λ_U\\,(1 - σ(β(z_0 - r_θ))) & \\text{undesirable}\\end{cases}

    ``Adv = λ_D βσ(z)(1-σ(z))`` for desirable, ``-λ_U βσ(z')(1-σ(z'))`` for undesirable examples,
    with ``z = β(r_θ - z_0)`` and ``z' = -z``.
    """
    logp_B, logp_ref_B = _sequence_sums(logp, logp_ref, mask)
    desirable_B = jnp.asarray(desirable, bool)
    if desirable_B.shape != logp_B.shape:
        raise ObjectiveConfigError(
            f"desirable must have shape [B] = {logp_B.shape}, got {desirable_B.shape}"
        )
    z0 = sg(jnp.asarray(reference_point, logp_B.dtype))
    z_B = config.beta * (logp_B - logp_ref_B - z0)
    signed_B = jnp.where(desirable_B, z_B, -z_B)
    weight_B = jnp.where(desirable_B, config.desirable_weight, config.undesirable_weight)
    value = jnp.mean(weight_B * jax.nn.sigmoid(-signed_B))
    slope_B = weight_B * config.beta * jax.nn.sigmoid(signed_B) * jax.nn.sigmoid(-signed_B)
    loss = _stitch(value, jnp.where(desirable_B, slope_B, -slope_B), logp_B)
    log_ratio_B = logp_B - logp_ref_B
    def mean_reward(selected_B):
        total = jnp.sum(jnp.where(selected_B, log_ratio_B, 0.0))
        return sg(config.beta * total / jnp.maximum(jnp.sum(selected_B), 1).astype(total.dtype))

    metrics = dict(
        reference_point=z0,
        reward_desirable=mean_reward(desirable_B),
        reward_undesirable=mean_reward(~desirable_B),
    )
    return loss, metrics


def preference_loss(
    algorithm: str | Objective,
    *,
    logp: jax.Array,
    logp_ref: jax.Array,
    mask: jax.Array,
    desirable: jax.Array | None = None,
    reference_point: jax.Array | float | None = None,
    mismatched_logp: jax.Array | None = None,
    mismatched_logp_ref: jax.Array | None = None,
    mismatched_mask: jax.Array | None = None,
    **options: Any,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The preference loss of ``algorithm`` (``dpo`` or ``kto``) and its metrics.

    Args:
      algorithm: ``dpo``, ``kto`` or a configuration of either from ``configure``.
      logp: ``[B, T]`` completion-token log-probs under the policy (differentiated).
      logp_ref: ``[B, T]`` the same under the reference model.
      mask: ``[B, T]``, 1 on completion tokens; other positions may hold NaN or Inf.
      desirable: KTO: ``[B]`` booleans, True for desirable examples.
      reference_point: KTO: ``z_0``, e.g. averaged across shards; computed from the mismatched
        pairs when omitted.
      mismatched_logp: KTO: ``[B, T]`` log-probs of mismatched (prompt, completion) pairs.
      mismatched_logp_ref: KTO: the same under the reference model.
      mismatched_mask: KTO: their completion mask.
      **options: overrides, e.g. ``beta=0.05``.

    DPO takes ``B = 2P`` rows: the ``P`` chosen completions, then their ``P`` rejected ones.

    Returns:
      ``(loss, metrics)``.
    """
    config = configure(algorithm, **options)
    if isinstance(config, DPOObjective):
        return dpo_loss(config, logp, logp_ref, mask)
    if not isinstance(config, KTOObjective):
        raise ObjectiveConfigError(
            f"algorithm {config.name!r} is a policy-gradient objective, use policy_loss; "
            f"preference_loss accepts: {', '.join(PREFERENCE_ALGORITHMS)}"
        )
    if desirable is None:
        raise ObjectiveConfigError("KTO needs desirable, one boolean label per example")
    if reference_point is None:
        if mismatched_logp is None or mismatched_logp_ref is None or mismatched_mask is None:
            raise ObjectiveConfigError(
                "KTO needs reference_point or the mismatched_logp, mismatched_logp_ref and "
                "mismatched_mask of mismatched pairs"
            )
        reference_point = kto_reference_point(
            mismatched_logp, mismatched_logp_ref, mismatched_mask
        )
    return kto_loss(config, logp, logp_ref, mask, desirable, reference_point)
