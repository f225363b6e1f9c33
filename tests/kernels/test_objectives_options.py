"""Options of the policy loss beyond the canonical forms: truncated importance correction, KL bias
correction, and the one-line rejections of inputs the loss cannot use."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.advantages import group_advantages
from kernels.errors import ObjectiveConfigError
from kernels.objectives import policy_loss
from tests.kernels import objective_fixtures as fx


@pytest.fixture(autouse=True)
def _float64():
    with jax.enable_x64(True):
        yield


ADVANTAGES = np.array([0.866024, -0.866024, -0.866024, 0.866024])
# The inference engine's log-probs differ from the trainer's recomputed old ones by these.
BEHAVIOUR_GAP = np.array(
    [[0.3, -0.1, 0.0, 0.0], [0.05, 1.0, 0.0, 0.0], [-0.2, 0.0, 0.1, 0.4], [2.0, 0.0, 0.0, 0.0]]
)
LOGP_BEHAVIOUR = np.where(fx.F_MASK, fx.F_LOGP_OLD - BEHAVIOUR_GAP, np.nan)


def run(algorithm, **kwargs):
    def loss(logp):
        return policy_loss(algorithm, logp=logp, logp_old=fx.F_LOGP_OLD, logp_ref=fx.F_LOGP_REF,
                           advantages=ADVANTAGES, mask=fx.F_MASK, **kwargs)

    (value, metrics), grad = jax.value_and_grad(loss, has_aux=True)(jnp.asarray(fx.F_LOGP))
    return float(value), np.asarray(grad), metrics


@pytest.mark.parametrize("algorithm", ["grpo", "cispo", "reinforce"])
def test_truncated_importance_correction_weights_every_token(algorithm):
    # w = min(π_old/π_behaviour, C) = min(e^gap, 2): e^2 = 7.39 is cut to 2, e^1 = 2.718 too.
    weight = np.where(fx.F_MASK, np.minimum(np.exp(BEHAVIOUR_GAP), 2.0), 0.0)
    plain_value, plain_grad, _ = run(algorithm)
    value, grad, metrics = run(algorithm, logp_behaviour=LOGP_BEHAVIOUR, tis_cap=2.0)
    np.testing.assert_allclose(grad, weight * plain_grad, atol=1e-12)
    assert float(metrics["tis_weight_mean"]) == pytest.approx(weight[fx.F_MASK].mean())
    if algorithm == "reinforce":  # value -Σ w·tis·Â·ℓ / N_seq, written out
        logp = np.where(fx.F_MASK, fx.F_LOGP, 0.0)
        assert value == pytest.approx(-np.sum(weight * ADVANTAGES[:, None] * logp) / 4)
        assert value != pytest.approx(plain_value)
    # k3 of KL(π_behaviour ‖ π_old): r = e^gap, r - 1 - gap, averaged over the 10 tokens.
    gap = BEHAVIOUR_GAP[fx.F_MASK]
    expected = np.mean(np.exp(gap) - 1 - gap)
    assert float(metrics["behaviour_kl"]) == pytest.approx(expected, abs=1e-12)


def test_behaviour_log_probs_without_a_cap_only_report():
    plain_value, plain_grad, _ = run("grpo")
    value, grad, metrics = run("grpo", logp_behaviour=LOGP_BEHAVIOUR)
    assert value == plain_value
    np.testing.assert_array_equal(grad, plain_grad)
    assert float(metrics["behaviour_kl"]) > 0.0


def test_kl_bias_correction_weights_the_kl_by_the_stopped_ratio():
    # β·Agg(sg[r]·k3): gradient β·w·r·(1 - e^{ℓ_ref - ℓ}) on top of the policy gradient.
    beta = 0.04
    pg_value, pg_grad, _ = run("grpo")
    value, grad, metrics = run("grpo", kl_coef=beta, kl_bias_correction=True)
    assert value == pytest.approx(pg_value + float(metrics["kl_loss"]), abs=1e-12)
    ratio = np.exp(np.where(fx.F_MASK, fx.F_DELTA, 0.0))
    logp = np.where(fx.F_MASK, fx.F_LOGP, 0.0)
    logp_ref = np.where(fx.F_MASK, fx.F_LOGP_REF, 0.0)
    k3 = np.exp(logp_ref - logp) - (logp_ref - logp) - 1
    weight = np.where(fx.F_MASK, 1.0 / (4 * fx.F_LENGTHS[:, None]), 0.0)
    assert float(metrics["kl_loss"]) == pytest.approx(beta * np.sum(weight * ratio * k3))
    kl_grad = beta * weight * ratio * (1 - np.exp(logp_ref - logp))
    np.testing.assert_allclose(grad, pg_grad + kl_grad, atol=1e-12)


def test_group_advantages_feed_the_loss_as_rows():
    advantages = group_advantages(fx.F_REWARDS.reshape(1, 4), "grpo").reshape(-1)
    loss, _ = policy_loss("grpo", logp=fx.F_LOGP, logp_old=fx.F_LOGP_OLD, logp_ref=None,
                          advantages=advantages, mask=fx.F_MASK)
    assert float(loss) == pytest.approx(-0.060091, abs=1e-6)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(algorithm="dpo"), "'dpo' is a preference objective, use preference_loss; "
                                "policy_loss accepts: reinforce, grpo"),
        (dict(advantages=np.ones(3)), r"advantages must have shape \[B\] or \[B, T\]"),
        (dict(mask=np.ones(4, bool)), r"mask must have shape \[B, T\]"),
        (dict(logp_old=None), "'grpo' needs logp_old"),
        (dict(kl_coef=0.1, logp_ref=None), "kl_coef 0.1 in the loss and needs logp_ref"),
        (dict(tis_cap=2.0), "tis_cap 2.0 needs logp_behaviour"),
        (dict(values=np.zeros((4, 4))), "values need values_old and returns"),
        (dict(clip_hi=0.3), "unknown option 'clip_hi' for algorithm 'grpo'"),
    ],
)
def test_unusable_inputs_are_rejected(kwargs, message):
    arguments = dict(algorithm="grpo", logp=fx.F_LOGP, logp_old=fx.F_LOGP_OLD,
                     logp_ref=fx.F_LOGP_REF, advantages=ADVANTAGES, mask=fx.F_MASK)
    arguments.update(kwargs)
    algorithm = arguments.pop("algorithm")
    with pytest.raises(ObjectiveConfigError, match=message):
        policy_loss(algorithm, **arguments)
