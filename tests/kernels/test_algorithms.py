"""The algorithm registry: canonical defaults as data, overrides, and one-line rejections."""

from __future__ import annotations

import dataclasses

import pytest

from kernels.algorithms import (
    ALGORITHMS,
    DPOObjective,
    KTOObjective,
    PolicyObjective,
    configure,
    options,
)
from kernels.errors import ObjectiveConfigError
from kernels.objectives import ALGORITHMS as EXPORTED
from kernels.objectives import ObjectiveConfigError as ExportedError


def test_registry_names_and_exports():
    assert list(ALGORITHMS) == [
        "reinforce", "grpo", "dapo", "drgrpo", "rloo", "gspo", "cispo", "ppo", "dpo", "kto"
    ]
    assert EXPORTED is ALGORITHMS and ExportedError is ObjectiveConfigError
    assert issubclass(ObjectiveConfigError, ValueError)
    with pytest.raises(TypeError):
        ALGORITHMS["mine"] = ALGORITHMS["grpo"]  # the registry is read-only


@pytest.mark.parametrize(
    "name, expected",
    [
        ("reinforce", dict(ratio="none", clip="none", aggregation="seq_mean_token_sum",
                           estimator="reinforce")),
        ("grpo", dict(ratio="token", clip="ppo", clip_low=0.2, clip_high=0.2, kl_coef=0.0,
                      aggregation="seq_mean_token_mean", estimator="grpo", advantage_eps=1e-6)),
        ("dapo", dict(clip_low=0.2, clip_high=0.28, aggregation="batch_token_mean", kl_coef=0.0,
                      dynamic_sampling=True, estimator="grpo")),
        ("drgrpo", dict(aggregation="max_length_mean", estimator="drgrpo", kl_coef=0.0)),
        ("rloo", dict(ratio="none", aggregation="seq_mean_token_sum", estimator="rloo",
                      kl_placement="reward", kl_estimator="k1", kl_coef=0.05)),
        ("gspo", dict(ratio="sequence", clip_low=3e-4, clip_high=4e-4,
                      aggregation="seq_mean_token_mean")),
        ("cispo", dict(clip="is_weight", clip_low=None, clip_high=0.28,
                       aggregation="batch_token_mean")),
        ("ppo", dict(dual_clip=3.0, aggregation="batch_token_mean", estimator="gae",
                     kl_placement="reward", value_clip=0.2, gae_gamma=1.0, gae_lambda=0.95)),
        ("dpo", dict(beta=0.1, label_smoothing=0.0)),
        ("kto", dict(beta=0.1, desirable_weight=1.0, undesirable_weight=1.0)),
    ],
)
def test_canonical_defaults(name, expected):
    algorithm = ALGORITHMS[name]
    assert algorithm.name == name
    assert {k: getattr(algorithm, k) for k in expected} == expected


def test_every_default_is_overridable_and_configs_are_hashable():
    for name, algorithm in ALGORITHMS.items():
        assert "name" not in options(algorithm)
        complete = dict(max_length=16) if name == "drgrpo" else {}
        configured = configure(name, **complete)
        assert hash(configured) == hash(dataclasses.replace(algorithm, **complete))
    assert configure("grpo", clip_high=0.28, aggregation="batch_token_mean").clip_high == 0.28
    assert configure(configure("dapo", clip_high=0.3), clip_low=0.1).clip_high == 0.3


@pytest.mark.parametrize(
    "name, overrides, message",
    [
        ("grpoo", {}, "unknown algorithm 'grpoo'; accepted: reinforce, grpo, dapo, drgrpo, "
                      "rloo, gspo, cispo, ppo, dpo, kto"),
        ("grpo", dict(epsilon=0.2), "unknown option 'epsilon' for algorithm 'grpo'; accepted: "
                                    "estimator, ratio, clip, clip_low"),
        ("dpo", dict(clip_low=0.2), "unknown option 'clip_low' for algorithm 'dpo'; accepted: "
                                    "beta, label_smoothing"),
        ("grpo", dict(aggregation="token-mean"), "aggregation 'token-mean' is not one of: "
                                                 "seq_mean_token_mean, batch_token_mean"),
        ("grpo", dict(estimator="ppo"), "estimator 'ppo' is not one of: reinforce, grpo"),
        ("grpo", dict(kl_estimator="low_var_kl"), "kl_estimator 'low_var_kl' is not one of: k1"),
        ("grpo", dict(clip_high="0.28"), "clip_high must be a number in .* got '0.28'"),
        ("grpo", dict(clip_low=1.5), "clip_low must be a number in \\[0.0, 1.0\\], got 1.5"),
        ("grpo", dict(clip_low=None), "clip_low must be a number"),
        ("ppo", dict(dual_clip=1.0), "dual_clip must be a number in \\(1.0, inf\\) or None"),
        ("grpo", dict(kl_coef=-0.1), "kl_coef must be a number in \\[0.0, inf\\), got -0.1"),
        ("grpo", dict(kl_bias_correction="yes"), "kl_bias_correction must be true or false"),
        ("drgrpo", dict(max_length=0), "max_length must be an integer in \\[1, inf\\)"),
        ("drgrpo", dict(max_length=4.5), "max_length must be an integer"),
        ("drgrpo", {}, "'max_length_mean' needs max_length.*never the padded width"),
        ("grpo", dict(aggregation="group_token_mean"), "needs group_size"),
        ("reinforce", dict(clip="ppo"), "clip 'ppo' needs an importance ratio"),
        ("cispo", dict(ratio="sequence"), "clip 'is_weight' works on ratio 'token'"),
        ("grpo", dict(dual_clip=3.0, clip="is_weight"), "dual_clip needs clip 'ppo'"),
        ("rloo", dict(kl_bias_correction=True), "kl_bias_correction needs kl_placement 'loss'"),
        ("dapo", dict(max_length=8, overlong_buffer=16), "overlong_buffer 16 exceeds max_length 8"),
        ("dpo", dict(label_smoothing=0.5), "label_smoothing must be below 0.5"),
        ("kto", dict(beta=0.0), "beta must be a number in \\(0.0, inf\\)"),
    ],
)
def test_bad_configurations_are_rejected_in_one_line(name, overrides, message):
    with pytest.raises(ObjectiveConfigError, match=message) as caught:
        configure(name, **overrides)
    assert "\n" not in str(caught.value)


def test_configurations_validate_on_construction():
    with pytest.raises(ObjectiveConfigError, match="ratio 'tokens' is not one of"):
        PolicyObjective("custom", estimator="grpo", ratio="tokens")
    assert DPOObjective(beta=0.5).beta == 0.5
    assert KTOObjective(undesirable_weight=2.0).undesirable_weight == 2.0
