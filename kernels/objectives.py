"""The unified RL objective: every policy-gradient algorithm as one surrogate with four parts.

RLAX writes every supported algorithm as

.. math::
    J(θ) = \\sum_{i,t} m_{i,t}\\; \\mathrm{sg}[\\mathrm{Agg}_{i,t}\\,\\mathrm{IS}_{i,t}]
           \\big(\\mathrm{sg}[\\mathrm{Adv}_{i,t}]\\,\\mathrm{GT1}_{i,t}(θ)
                 + \\mathrm{GT2}_{i,t}(θ)\\big),

and the loss minimised is ``L = -J``. An algorithm (:mod:`kernels.algorithms`) picks the parts:

* ``Agg``: the aggregation weight (:mod:`kernels.aggregation`).
* ``IS``: 1 (on-policy), the token ratio ``r = exp(ℓ - ℓ_old)``, GSPO's sequence ratio
  ``s_i = exp(Σ_t (ℓ - ℓ_old) / |o_i|)``, the full product ``ρ_i`` (entering as ``|o_i| ρ_i``,
  because ``∂ρ_i/∂ℓ_{i,t} = ρ_i``), or CISPO's clipped weight ``clip(r, 1-ε_l, 1+ε_h)``; times
  an optional truncated correction ``min(π_old/π_behaviour, C)`` for an inference engine whose
  log-probs differ from the trainer's.
* ``GT1 = 1^keep ℓ``: PPO-style clipping keeps the gradient of a token only inside the trust
  region (``A > 0: r < 1+ε_h``; ``A < 0: 1-ε_l < r < c``), because
  ``∇ min(rA, clip(r)A) = 1^keep r A ∇ℓ``. Without clipping, and for CISPO, ``GT1 = ℓ``.
* ``GT2 = -β KL``: the KL to the reference model placed in the loss, not ratio-weighted unless
  ``kl_bias_correction`` (where it is weighted by ``sg[r]``).

The returned *value* is each algorithm's reference loss (the clipped PPO surrogate
``max(-A r, -A clip(r))``, CISPO's ``-sg[r̂] A ℓ``, REINFORCE's ``-A ℓ``, ...) so that logs match
VERL and TRL; the *gradient* is the unified surrogate's, attached by a custom JVP
(:func:`kernels.surrogate.unified_loss`): exact in value and first-order exact in gradient
(second derivatives are the surrogate's, i.e. zero in ``ℓ``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from kernels.aggregation import Totals, masked_mean, token_weights
from kernels.algorithms import (
    ALGORITHMS,
    POLICY_ALGORITHMS,
    Objective,
    PolicyObjective,
    configure,
)
from kernels.dtypes import float_dtype
from kernels.errors import ObjectiveConfigError
from kernels.kl import token_kl
from kernels.preference import preference_loss
from kernels.surrogate import unified_loss
from kernels.value_loss import value_loss

__all__ = [
    "ALGORITHMS",
    "ObjectiveConfigError",
    "configure",
    "policy_loss",
    "preference_loss",
]

sg = jax.lax.stop_gradient


class _Parts(NamedTuple):
    """Per-token pieces of one algorithm; all are constants except through ``ℓ`` in the loss."""

    value_BT: jax.Array  # reference per-token loss
    advantage_BT: jax.Array  # Adv (per sequence for sequence-level losses)
    weight_BT: jax.Array  # IS
    keep_BT: jax.Array  # the indicator in GT1
    ratio_BT: jax.Array  # the ratio the algorithm clips (for metrics)
    clipped_BT: jax.Array | None  # tokens whose value the clip decided; None: no clipping
    dual_clipped_BT: jax.Array | None


def _exp_bounded(log_ratio: jax.Array, bound: float) -> jax.Array:
    return jnp.exp(jnp.clip(log_ratio, -bound, bound))


def _ratios(config: PolicyObjective, log_ratio_BT, token_ratio_BT, advantages_BT,
            advantages_B, mask_BT, lengths_B):
    """``(ratio_BT, is_BT, advantages_BT)`` for the configured ratio level."""
    bound = config.log_ratio_bound
    if config.ratio in ("none", "token"):
        return token_ratio_BT, token_ratio_BT, advantages_BT
    lengths_B = lengths_B.astype(log_ratio_BT.dtype)
    per_token_B = 1.0 / jnp.maximum(lengths_B, 1.0)
    log_ratio_B = jnp.sum(log_ratio_BT, axis=1)
    if config.ratio != "sequence_product":
        log_ratio_B = log_ratio_B * per_token_B
    ratio_BT = jnp.broadcast_to(_exp_bounded(log_ratio_B, bound)[:, None], mask_BT.shape)
    if config.ratio == "sequence_token":
        return ratio_BT, ratio_BT, advantages_BT
    # A sequence-level loss sees one advantage per sequence: the row mean of token advantages.
    if advantages_B is None:
        advantages_B = jnp.sum(advantages_BT, axis=1) * per_token_B
        advantages_BT = jnp.where(mask_BT, advantages_B[:, None], 0.0)
    if config.ratio == "sequence":
        return ratio_BT, ratio_BT, advantages_BT
    return ratio_BT, ratio_BT * lengths_B[:, None], advantages_BT


def _parts(config: PolicyObjective, logp_BT, log_ratio_BT, token_ratio_BT, advantages_BT,
           advantages_B, mask_BT, lengths_B) -> _Parts:
    ratio_BT, is_BT, advantages_BT = _ratios(
        config, log_ratio_BT, token_ratio_BT, advantages_BT, advantages_B, mask_BT, lengths_B
    )
    if config.clip == "ppo":
        assert config.clip_high is not None and config.clip_low is not None  # checked for "ppo"
        upper, lower = 1.0 + config.clip_high, 1.0 - config.clip_low
        positive_BT = advantages_BT > 0
        negative_core_BT = jnp.maximum(ratio_BT, lower)
        keep_negative_BT = ratio_BT > lower
        dual_clipped_BT = None
        if config.dual_clip is not None:
            negative_core_BT = jnp.minimum(negative_core_BT, config.dual_clip)
            keep_negative_BT &= ratio_BT < config.dual_clip
            dual_clipped_BT = (advantages_BT < 0) & (ratio_BT >= config.dual_clip)
        # max(-A r, -A clip(r)) in closed form, dual-clipped at c|A| for A < 0.
        value_BT = -advantages_BT * jnp.where(
            positive_BT, jnp.minimum(ratio_BT, upper), negative_core_BT
        )
        keep_BT = jnp.where(positive_BT, ratio_BT < upper, keep_negative_BT)
        clipped_BT = ~keep_BT & (advantages_BT != 0)
        return _Parts(
            value_BT, advantages_BT, is_BT, keep_BT, ratio_BT, clipped_BT, dual_clipped_BT
        )
    if config.clip == "is_weight":
        low = None if config.clip_low is None else 1.0 - config.clip_low
        high = None if config.clip_high is None else 1.0 + config.clip_high
        weight_BT = jnp.clip(ratio_BT, low, high)
        value_BT = -weight_BT * advantages_BT * logp_BT
        keep_BT = jnp.ones(mask_BT.shape, bool)
        return _Parts(
            value_BT, advantages_BT, weight_BT, keep_BT, ratio_BT, weight_BT != ratio_BT, None
        )
    keep_BT = jnp.ones(mask_BT.shape, bool)
    if config.ratio == "none":
        ones_BT = jnp.ones_like(ratio_BT)
        value_BT = -advantages_BT * logp_BT
        return _Parts(value_BT, advantages_BT, ones_BT, keep_BT, ratio_BT, None, None)
    return _Parts(-advantages_BT * ratio_BT, advantages_BT, is_BT, keep_BT, ratio_BT, None, None)


def _token_metrics(parts: _Parts, token_ratio_BT, log_ratio_BT, mask_BT, count):
    """Token means of the clip indicators, ``approx_kl`` and the ratio, and the ratio's extremes.

    Stacked into one sum and one max over the batch: every separate reduction of a ``[B, T]``
    operand costs a full pass over memory, which for these cheap terms is all the cost there is.
    """
    terms = {
        "clip_fraction": parts.clipped_BT,
        "dual_clip_fraction": parts.dual_clipped_BT,
        # k3 of KL(π_old ‖ π_θ) from the ratio already at hand: r - 1 - log r.
        "approx_kl": token_ratio_BT - 1.0 - log_ratio_BT,
        "ratio_mean": parts.ratio_BT,
    }
    present = {k: v.astype(log_ratio_BT.dtype) for k, v in terms.items() if v is not None}
    sums_K = jnp.sum(jnp.where(mask_BT, jnp.stack(list(present.values())), 0.0), axis=(1, 2))
    metrics = {k: jnp.zeros((), log_ratio_BT.dtype) for k in terms}
    metrics.update(
        zip(present, sums_K / jnp.maximum(count, 1).astype(sums_K.dtype), strict=True)
    )
    signed_ratio_2BT = jnp.stack([parts.ratio_BT, -parts.ratio_BT])
    extremes_2 = jnp.max(jnp.where(mask_BT, signed_ratio_2BT, -jnp.inf), axis=(1, 2))
    extremes_2 = jnp.where(count > 0, extremes_2, 0.0)
    metrics.update(ratio_max=extremes_2[0], ratio_min=-extremes_2[1])
    return metrics


def policy_loss(
    algorithm: str | Objective,
    *,
    logp: jax.Array,
    logp_old: jax.Array | None,
    logp_ref: jax.Array | None = None,
    advantages: jax.Array,
    mask: jax.Array,
    logp_behaviour: jax.Array | None = None,
    values: jax.Array | None = None,
    values_old: jax.Array | None = None,
    returns: jax.Array | None = None,
    totals: Totals | None = None,
    **options: Any,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The policy-gradient loss of ``algorithm`` and its metrics (see the module docstring).

    Args:
      algorithm: a name in :data:`ALGORITHMS` or a configuration from :func:`configure`.
      logp: ``[B, T]`` log-probs of the sampled tokens under the current policy (differentiated).
      logp_old: ``[B, T]`` log-probs under ``θ_old`` recomputed by the trainer; None only for an
        on-policy algorithm (ratio ``none``).
      logp_ref: ``[B, T]`` reference-model log-probs; needed when KL is in the loss.
      advantages: ``[B]`` per sequence or ``[B, T]`` per token.
      mask: ``[B, T]``; 1 on tokens that enter the loss. Other positions of every array may hold
        NaN or Inf; they reach neither the value nor the gradient.
      logp_behaviour: ``[B, T]`` log-probs reported by the inference engine; with ``tis_cap`` set
        each token is weighted by ``min(π_old/π_behaviour, tis_cap)``.
      values: ``[B, T]`` value predictions; adds ``value_coef`` × the clipped value loss.
      values_old: ``[B, T]`` predictions at rollout time (with ``values``).
      returns: ``[B, T]`` GAE returns (with ``values``).
      totals: global normalisers when the batch is one shard or micro-batch of a larger one.
      **options: overrides of the algorithm's parts, e.g. ``clip_high=0.28``.

    Returns:
      ``(loss, metrics)``: the scalar loss (float32, or float64 for float64 inputs) and scalar
      metrics (token means over this batch): ``policy_loss``, ``kl_loss``, ``clip_fraction``,
      ``dual_clip_fraction``, ``approx_kl`` (k3 estimate of ``KL(π_old ‖ π_θ)``), ``ratio_mean``,
      ``ratio_min``, ``ratio_max``; ``value_loss`` with values; ``behaviour_kl`` and
      ``tis_weight_mean`` with behaviour log-probs.

    Raises:
      ObjectiveConfigError: bad algorithm, option or shapes.
    """
    config = configure(algorithm, **options)
    if not isinstance(config, PolicyObjective):
        raise ObjectiveConfigError(
            f"algorithm {config.name!r} is a preference objective, use preference_loss; "
            f"policy_loss accepts: {', '.join(POLICY_ALGORITHMS)}"
        )
    mask_BT = jnp.asarray(mask, bool)
    if mask_BT.ndim != 2:
        raise ObjectiveConfigError(f"mask must have shape [B, T], got {mask_BT.shape}")
    advantages = jnp.asarray(advantages)
    if advantages.shape not in (mask_BT.shape[:1], mask_BT.shape):
        raise ObjectiveConfigError(
            f"advantages must have shape [B] or [B, T] = {mask_BT.shape}, got {advantages.shape}"
        )
    if logp_old is None and config.ratio != "none":
        raise ObjectiveConfigError(f"algorithm {config.name!r} needs logp_old for its ratio")
    logp = jnp.asarray(logp)
    dtype = float_dtype(logp)

    def constant(array_BT):
        return sg(jnp.where(mask_BT, array_BT, 0.0).astype(dtype))

    logp_BT = jnp.where(mask_BT, logp, 0.0).astype(dtype)
    logp_old_BT = sg(logp_BT) if logp_old is None else constant(logp_old)
    advantages_B = None
    if advantages.ndim == 1:
        advantages_B = sg(advantages.astype(dtype))
        advantages = advantages[:, None]
    advantages_BT = constant(jnp.broadcast_to(advantages, mask_BT.shape))
    lengths_B = jnp.sum(mask_BT, axis=1, dtype=jnp.int32)
    weight_options: dict[str, Any] = dict(totals=totals, max_length=config.max_length, group_size=config.group_size)
    agg_BT = token_weights(mask_BT, config.aggregation, dtype=dtype, **weight_options)

    log_ratio_BT = sg(logp_BT) - logp_old_BT
    token_ratio_BT = _exp_bounded(log_ratio_BT, config.log_ratio_bound)
    parts = _parts(config, sg(logp_BT), log_ratio_BT, token_ratio_BT, advantages_BT,
                   advantages_B, mask_BT, lengths_B)
    metrics = {}
    coef_BT = agg_BT
    if logp_behaviour is not None:
        logp_behaviour_BT = constant(logp_behaviour)
        behaviour_log_ratio_BT = logp_old_BT - logp_behaviour_BT
        # k3 estimate of KL(π_behaviour ‖ π_old) from the behaviour policy's own samples.
        metrics["behaviour_kl"] = masked_mean(
            token_kl(logp_behaviour_BT, logp_old_BT, "k3", mask_BT=mask_BT), mask_BT
        )
        tis_BT = _exp_bounded(behaviour_log_ratio_BT, config.log_ratio_bound)
        if config.tis_cap is not None:
            tis_BT = jnp.minimum(tis_BT, config.tis_cap)
            coef_BT = agg_BT * tis_BT
        metrics["tis_weight_mean"] = masked_mean(tis_BT, mask_BT)
    elif config.tis_cap is not None:
        raise ObjectiveConfigError(
            f"tis_cap {config.tis_cap} needs logp_behaviour, the inference engine's log-probs"
        )

    pg_value = jnp.sum(jnp.where(mask_BT, coef_BT * parts.value_BT, 0.0))
    grad_coef_BT = jnp.where(
        parts.keep_BT & mask_BT, coef_BT * parts.weight_BT * parts.advantage_BT, 0.0
    )
    loss = unified_loss(sg(pg_value), sg(grad_coef_BT), logp_BT)

    kl_loss = jnp.zeros((), dtype)
    if config.kl_placement == "loss" and config.kl_coef > 0:
        if logp_ref is None:
            raise ObjectiveConfigError(
                f"algorithm {config.name!r} has kl_coef {config.kl_coef} in the loss and needs "
                "logp_ref"
            )
        kl_BT = token_kl(logp_BT, constant(logp_ref), config.kl_estimator, mask_BT=mask_BT)
        if config.kl_bias_correction:
            kl_BT = kl_BT * parts.ratio_BT
        kl_loss = config.kl_coef * jnp.sum(jnp.where(mask_BT, agg_BT * kl_BT, 0.0))
        loss = loss + kl_loss

    if values is not None:
        if values_old is None or returns is None:
            raise ObjectiveConfigError("values need values_old and returns for the value loss")
        vf_loss = value_loss(
            values, values_old, returns, mask_BT, clip=config.value_clip,
            aggregation=config.aggregation, **weight_options,
        )
        metrics["value_loss"] = sg(vf_loss)
        loss = loss + config.value_coef * vf_loss

    bounded_log_ratio_BT = jnp.clip(log_ratio_BT, -config.log_ratio_bound, config.log_ratio_bound)
    metrics.update(
        _token_metrics(parts, token_ratio_BT, bounded_log_ratio_BT, mask_BT, jnp.sum(lengths_B))
    )
    metrics.update(policy_loss=sg(pg_value), kl_loss=sg(kl_loss))
    return loss, metrics
