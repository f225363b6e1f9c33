"""The algorithm registry: every algorithm is data, a named configuration of the objective's parts.

A policy-gradient algorithm is a :class:`PolicyObjective`, i.e. a choice of importance ratio
(``IS``), clipping (which decides ``GT1``), aggregation (``Agg``), KL term (``GT2``) and the
advantage estimator that produces ``Adv`` (see :mod:`kernels.objectives` for the formula). The
preference algorithms are :class:`DPOObjective` and :class:`KTOObjective`. :data:`ALGORITHMS`
holds the canonical form of each; :func:`configure` applies overrides and rejects unknown names,
unknown options, bad values and invalid combinations with one line naming what is accepted.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping
from typing import Any

from kernels.advantages import ESTIMATORS
from kernels.aggregation import AGGREGATIONS
from kernels.errors import ObjectiveConfigError, reject
from kernels.kl import KL_ESTIMATORS

RATIOS = ("none", "token", "sequence", "sequence_token", "sequence_product")
CLIPS = ("none", "ppo", "is_weight")
KL_PLACEMENTS = ("loss", "reward")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class _Checker:
    """Collects the one-line complaints of one configuration."""

    def __init__(self, config: Any):
        self.name = config.name
        self.config = config

    def fail(self, message: str) -> ObjectiveConfigError:
        return ObjectiveConfigError(f"algorithm {self.name!r}: {message}")

    def choice(self, field: str, accepted: tuple[str, ...]) -> None:
        value = getattr(self.config, field)
        if value not in accepted:
            raise self.fail(f"{field} {value!r} is not one of: {', '.join(accepted)}")

    def number(self, field: str, low: float, high: float = math.inf, *, open_low: bool = False,
               optional: bool = False, integer: bool = False) -> None:
        value = getattr(self.config, field)
        if value is None and optional:
            return
        bounds = f"{'(' if open_low else '['}{low}, {high}{')' if math.isinf(high) else ']'}"
        kind = "an integer" if integer else "a number"
        ok = _is_number(value) and (not integer or isinstance(value, int))
        if not ok or value < low or value > high or (open_low and value == low):
            none = " or None" if optional else ""
            raise self.fail(f"{field} must be {kind} in {bounds}{none}, got {value!r}")

    def flag(self, field: str) -> None:
        value = getattr(self.config, field)
        if not isinstance(value, bool):
            raise self.fail(f"{field} must be true or false, got {value!r}")


@dataclasses.dataclass(frozen=True)
class PolicyObjective:
    """One policy-gradient algorithm as a configuration of the unified objective.

    Attributes:
      name: registry name of the algorithm this configuration derives from.
      estimator: the advantage estimator the algorithm pairs with, one of
        :data:`kernels.advantages.ESTIMATORS`.
      ratio: importance ratio ``IS``. ``none``: on-policy, ``IS = 1``. ``token``: ``r = π/π_old``
        per token. ``sequence``: GSPO's length-normalised ``s_i = (π(o_i)/π_old(o_i))^{1/|o_i|}``
        with per-sequence advantages. ``sequence_token``: GSPO-token, ``s_i`` with per-token
        advantages. ``sequence_product``: the full product ``ρ_i = π(o_i)/π_old(o_i)`` (TRL RLOO).
      clip: ``ppo`` drops the gradient of tokens outside the trust region (asymmetric
        ``[1-clip_low, 1+clip_high]``, dual clip below ``-dual_clip·|A|``); ``is_weight`` (CISPO)
        clips the stop-gradient IS weight itself and keeps every token's gradient.
      clip_low: ``ε_low``; for ``is_weight`` None means no lower bound.
      clip_high: ``ε_high``; for ``is_weight`` None means no upper bound.
      dual_clip: ``c > 1`` of dual-clip PPO, or None.
      aggregation: ``Agg``, one of :data:`kernels.aggregation.AGGREGATIONS`.
      max_length: ``L_max``, the configured maximum response length (``max_length_mean``, overlong
        shaping).
      group_size: responses per prompt (``group_token_mean``).
      kl_coef: ``β``. With ``kl_placement='loss'`` the loss adds ``β·Agg(KL)``; with ``reward``
        the runtime subtracts ``β·KL`` from the rewards (:mod:`kernels.kl`) and the loss has none.
      kl_estimator: one of :data:`kernels.kl.KL_ESTIMATORS`.
      kl_placement: ``loss`` or ``reward``.
      kl_bias_correction: weight the in-loss KL by the importance ratio (TRL option).
      log_ratio_bound: ``|ℓ - ℓ_old|`` is clamped to this before ``exp``, a numerical guard.
      tis_cap: truncated importance correction between the inference engine's log-probs and the
        recomputed old ones: every token is weighted by ``sg[min(π_old/π_behaviour, tis_cap)]``
        when behaviour log-probs are given; None disables it.
      advantage_eps: ``ε_A`` of the ``grpo`` estimator.
      gae_gamma: ``γ`` of GAE.
      gae_lambda: ``λ`` of GAE.
      value_clip: ``ε_v`` of the clipped value loss.
      value_coef: weight of the value loss when values are passed to the policy loss.
      dynamic_sampling: drop prompt groups with constant rewards before advantages (DAPO).
      overlong_buffer: ``L_cache`` of DAPO's soft overlong punishment, or None.
    """

    name: str
    estimator: str
    ratio: str = "token"
    clip: str = "ppo"
    clip_low: float | None = 0.2
    clip_high: float | None = 0.2
    dual_clip: float | None = None
    aggregation: str = "seq_mean_token_mean"
    max_length: int | None = None
    group_size: int | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_placement: str = "loss"
    kl_bias_correction: bool = False
    log_ratio_bound: float = 20.0
    tis_cap: float | None = None
    advantage_eps: float = 1e-6
    gae_gamma: float = 1.0
    gae_lambda: float = 0.95
    value_clip: float = 0.2
    value_coef: float = 0.1
    dynamic_sampling: bool = False
    overlong_buffer: int | None = None

    def __post_init__(self):
        check = _Checker(self)
        check.choice("estimator", ESTIMATORS)
        check.choice("ratio", RATIOS)
        check.choice("clip", CLIPS)
        check.choice("aggregation", AGGREGATIONS)
        check.choice("kl_estimator", KL_ESTIMATORS)
        check.choice("kl_placement", KL_PLACEMENTS)
        is_weight = self.clip == "is_weight"
        check.number("clip_low", 0.0, 1.0, optional=is_weight)
        check.number("clip_high", 0.0, open_low=True, optional=is_weight)
        check.number("dual_clip", 1.0, open_low=True, optional=True)
        check.number("max_length", 1, optional=True, integer=True)
        check.number("group_size", 1, optional=True, integer=True)
        check.number("kl_coef", 0.0)
        check.flag("kl_bias_correction")
        check.number("log_ratio_bound", 0.0, open_low=True)
        check.number("tis_cap", 0.0, open_low=True, optional=True)
        check.number("advantage_eps", 0.0)
        check.number("gae_gamma", 0.0, 1.0)
        check.number("gae_lambda", 0.0, 1.0)
        check.number("value_clip", 0.0, open_low=True)
        check.number("value_coef", 0.0)
        check.flag("dynamic_sampling")
        check.number("overlong_buffer", 1, optional=True, integer=True)
        if self.clip == "ppo" and self.clip_low is not None and self.clip_low >= 1.0:
            raise check.fail(f"clip_low must be below 1 for clip 'ppo', got {self.clip_low!r}")
        if self.clip != "none" and self.ratio == "none":
            raise check.fail(
                f"clip {self.clip!r} needs an importance ratio; with ratio 'none' use clip 'none'"
            )
        if is_weight and self.ratio != "token":
            raise check.fail(f"clip 'is_weight' works on ratio 'token', not {self.ratio!r}")
        if self.dual_clip is not None and self.clip != "ppo":
            raise check.fail(f"dual_clip needs clip 'ppo', not {self.clip!r}")
        if self.kl_bias_correction and (self.kl_placement != "loss" or self.ratio == "none"):
            raise check.fail("kl_bias_correction needs kl_placement 'loss' and an importance ratio")
        if (
            self.overlong_buffer is not None
            and self.max_length is not None
            and self.overlong_buffer > self.max_length
        ):
            raise check.fail(
                f"overlong_buffer {self.overlong_buffer} exceeds max_length {self.max_length}"
            )

    def require_complete(self) -> None:
        """Rejects a configuration that still lacks a value its aggregation needs."""
        if self.aggregation == "max_length_mean" and self.max_length is None:
            raise _Checker(self).fail(
                "aggregation 'max_length_mean' needs max_length, the configured maximum "
                "response length (a constant, never the padded width); got None"
            )
        if self.aggregation == "group_token_mean" and self.group_size is None:
            raise _Checker(self).fail(
                "aggregation 'group_token_mean' needs group_size, the responses per prompt; "
                "got None"
            )
        if self.overlong_buffer is not None and self.max_length is None:
            raise _Checker(self).fail(
                "overlong_buffer needs max_length, the configured maximum response length; got None"
            )


@dataclasses.dataclass(frozen=True)
class DPOObjective:
    """Direct preference optimisation, sigmoid loss with optional label smoothing (cDPO).

    Attributes:
      name: registry name.
      beta: ``β``, the inverse temperature of the implicit reward.
      label_smoothing: ``ε`` in ``[0, 0.5)``, the assumed rate of flipped preference labels.
    """

    name: str = "dpo"
    beta: float = 0.1
    label_smoothing: float = 0.0

    def __post_init__(self):
        check = _Checker(self)
        check.number("beta", 0.0, open_low=True)
        check.number("label_smoothing", 0.0, 0.5)
        if self.label_smoothing == 0.5:
            raise check.fail("label_smoothing must be below 0.5, got 0.5")

    def require_complete(self) -> None:
        """Every DPO configuration is complete."""


@dataclasses.dataclass(frozen=True)
class KTOObjective:
    """Kahneman-Tversky optimisation from unpaired desirable and undesirable examples.

    Attributes:
      name: registry name.
      beta: ``β``.
      desirable_weight: ``λ_D``.
      undesirable_weight: ``λ_U``.
    """

    name: str = "kto"
    beta: float = 0.1
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0

    def __post_init__(self):
        check = _Checker(self)
        check.number("beta", 0.0, open_low=True)
        check.number("desirable_weight", 0.0, open_low=True)
        check.number("undesirable_weight", 0.0, open_low=True)

    def require_complete(self) -> None:
        """Every KTO configuration is complete."""


Objective = PolicyObjective | DPOObjective | KTOObjective

_GROUP: dict[str, Any] = dict(estimator="grpo", ratio="token", clip="ppo")
ALGORITHMS: Mapping[str, Objective] = types.MappingProxyType({
    "reinforce": PolicyObjective(
        "reinforce", estimator="reinforce", ratio="none", clip="none",
        aggregation="seq_mean_token_sum",
    ),
    "grpo": PolicyObjective("grpo", **_GROUP, aggregation="seq_mean_token_mean"),
    "dapo": PolicyObjective(
        "dapo", **_GROUP, clip_low=0.2, clip_high=0.28, aggregation="batch_token_mean",
        dynamic_sampling=True,
    ),
    "drgrpo": PolicyObjective(
        "drgrpo", estimator="drgrpo", ratio="token", clip="ppo", aggregation="max_length_mean"
    ),
    "rloo": PolicyObjective(
        "rloo", estimator="rloo", ratio="none", clip="none", aggregation="seq_mean_token_sum",
        kl_coef=0.05, kl_estimator="k1", kl_placement="reward",
    ),
    "gspo": PolicyObjective(
        "gspo", estimator="grpo", ratio="sequence", clip="ppo", clip_low=3e-4, clip_high=4e-4,
        aggregation="seq_mean_token_mean",
    ),
    "cispo": PolicyObjective(
        "cispo", estimator="grpo", ratio="token", clip="is_weight", clip_low=None,
        clip_high=0.28, aggregation="batch_token_mean",
    ),
    "ppo": PolicyObjective(
        "ppo", estimator="gae", ratio="token", clip="ppo", dual_clip=3.0,
        aggregation="batch_token_mean", kl_coef=0.05, kl_estimator="k1", kl_placement="reward",
    ),
    "dpo": DPOObjective(),
    "kto": KTOObjective(),
})
"""The canonical form of every algorithm; override parts with :func:`configure`."""

POLICY_ALGORITHMS = tuple(n for n, a in ALGORITHMS.items() if isinstance(a, PolicyObjective))
PREFERENCE_ALGORITHMS = tuple(n for n in ALGORITHMS if n not in POLICY_ALGORITHMS)


def options(algorithm: Objective) -> tuple[str, ...]:
    """The option names an algorithm accepts as overrides."""
    return tuple(f.name for f in dataclasses.fields(algorithm) if f.name != "name")


def configure(algorithm: str | Objective, /, **overrides: Any) -> Objective:
    """The configuration of ``algorithm`` with ``overrides`` applied, validated and complete.

    Args:
      algorithm: a registry name or a configuration to start from.
      **overrides: option values, e.g. ``clip_high=0.28`` or ``aggregation="batch_token_mean"``.

    Returns:
      A frozen configuration (hashable, usable as a static argument under ``jit``).

    Raises:
      ObjectiveConfigError: unknown algorithm or option, a bad value, an invalid combination, or a
        value the configuration still lacks (e.g. ``max_length`` for ``max_length_mean``).
    """
    if isinstance(algorithm, str):
        if algorithm not in ALGORITHMS:
            raise reject("algorithm", algorithm, ALGORITHMS)
        algorithm = ALGORITHMS[algorithm]
    elif not isinstance(algorithm, (PolicyObjective, DPOObjective, KTOObjective)):
        raise reject("algorithm", algorithm, ALGORITHMS)
    accepted = options(algorithm)
    for key in overrides:
        if key not in accepted:
            raise ObjectiveConfigError(
                f"unknown option {key!r} for algorithm {algorithm.name!r}; "
                f"accepted: {', '.join(accepted)}"
            )
    configured = dataclasses.replace(algorithm, **overrides) if overrides else algorithm
    configured.require_complete()
    return configured
