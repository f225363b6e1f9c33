"""Every worked example of the objectives spec (§6), value and gradient, to 6 decimals.

Fixtures F and P hold NaN or ±Inf in every padded slot, so each example also checks that padding
reaches neither the value nor the gradient. Gradients are ∂L/∂ℓ_new at the table values.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.advantages import gae_advantages, group_advantages, token_rewards, whiten
from kernels.kl import token_kl
from kernels.objectives import policy_loss, preference_loss
from kernels.value_loss import value_loss
from tests.kernels import objective_fixtures as fx

TOL = 1e-6  # the spec rounds to 6 decimals


@pytest.fixture(autouse=True)
def _float64():
    with jax.enable_x64(True):
        yield


def f_advantages(estimator: str) -> jax.Array:
    return group_advantages(fx.F_REWARDS[None, :], estimator)[0]


def loss_and_grad(algorithm, advantages, logp=fx.F_LOGP, **options):
    def loss(logp_BT):
        return policy_loss(
            algorithm,
            logp=logp_BT,
            logp_old=fx.F_LOGP_OLD,
            logp_ref=fx.F_LOGP_REF,
            advantages=advantages,
            mask=fx.F_MASK,
            **options,
        )

    (value, metrics), grad = jax.value_and_grad(loss, has_aux=True)(jnp.asarray(logp))
    assert np.all(np.isfinite(grad))
    return float(value), np.asarray(grad), metrics


def grad_matrix(rows):
    return fx.padded(rows, fx.F_MASK)


# --- 6.1 REINFORCE --------------------------------------------------------------------------


@pytest.mark.slow
def test_reinforce_without_baseline():
    # Â = R = [1, 0, 0, 1], seq_mean_token_sum (1/N_seq = 1/4):
    # L = -(1/4)[(-0.90 - 0.28 - 2.05) + (-0.60)] = 3.83/4 = 0.9575; ∂L/∂ℓ = -Â/4.
    value, grad, _ = loss_and_grad("reinforce", fx.F_REWARDS)
    assert value == pytest.approx(0.957500, abs=TOL)
    expected = np.where(fx.F_MASK, -fx.F_REWARDS[:, None] / 4, 0.0)
    np.testing.assert_allclose(grad, expected, atol=TOL)


def test_reinforce_with_mean_baseline():
    # b = R̄ = 0.5, Â = [0.5, -0.5, -0.5, 0.5]:
    # L = -(1/4)[0.5(-3.23) - 0.5(-0.5 - 1.0) - 0.5(-0.3 - 1.6 - 0.65 - 2.5) + 0.5(-0.6)]
    #   = -(1/4)(-1.615 + 0.75 + 2.525 - 0.30) = -0.415.
    advantages = group_advantages(fx.F_REWARDS[None], "reinforce", baseline=0.5)[0]
    value, grad, _ = loss_and_grad("reinforce", advantages)
    assert value == pytest.approx(-0.415000, abs=TOL)
    expected = np.where(fx.F_MASK, np.array([-0.125, 0.125, 0.125, -0.125])[:, None], 0.0)
    np.testing.assert_allclose(grad, expected, atol=TOL)


# --- 6.2 GRPO -------------------------------------------------------------------------------

GRPO_GRAD = [
    [-0.079759, 0.000000, -0.068649],
    [0.000000, 0.132220],
    [0.054126, 0.048976, 0.069500, 0.000000],
    [0.000000],
]


def test_grpo_advantages_and_epsilon_variants():
    # R̄ = 0.5, sample std (ddof 1) = sqrt(4·0.25/3) = 0.577350; 0.5/(0.577350 + ε_A).
    np.testing.assert_allclose(f_advantages("grpo"), [0.866024, -0.866024, -0.866024, 0.866024],
                               atol=TOL)
    trl = group_advantages(fx.F_REWARDS[None], "grpo", eps=1e-4)[0]
    exact = group_advantages(fx.F_REWARDS[None], "grpo", eps=0.0)[0]
    assert float(trl[0]) == pytest.approx(0.865875, abs=TOL)
    assert float(exact[0]) == pytest.approx(0.866025, abs=TOL)


def test_grpo_seq_mean_token_mean():
    # Per-token clipped loss, e.g. o1t1: r = e^0.1 = 1.105171 → -0.866024·1.105171 = -0.957104;
    # o1t2: r = 1.246077 > 1.2 → -0.866024·1.2 = -1.039229 (clipped, gradient 0).
    # L = (1/4)[(-0.957104 - 1.039229 - 0.823787)/3 + (0.692819 + 1.057764)/2
    #           + (0.866024 + 0.783611 + 1.111997 + 0.692819)/4 + (-1.039229)/1] = -0.060091
    value, grad, metrics = loss_and_grad("grpo", f_advantages("grpo"))
    assert value == pytest.approx(-0.060091, abs=TOL)
    np.testing.assert_allclose(grad, grad_matrix(GRPO_GRAD), atol=TOL)
    # Clip-active tokens: o1t2, o2t1, o3t4, o4t1 → 4 of 10.
    assert float(metrics["clip_fraction"]) == pytest.approx(0.4)


def test_grpo_with_k3_kl_in_loss():
    # pg -0.060091 + 0.04 × seq-mean-token-mean k3 0.075955 = -0.057053; the KL gradient
    # β(1 - e^{ℓ_ref - ℓ})/(4|o_i|) reaches clipped tokens too (o4t1: 0.04(1 - e^-0.7)/4).
    value, grad, metrics = loss_and_grad("grpo", f_advantages("grpo"), kl_coef=0.04)
    assert value == pytest.approx(-0.057053, abs=TOL)
    assert float(metrics["kl_loss"]) == pytest.approx(0.04 * 0.075955, abs=TOL)
    expected = [
        [-0.078895, 0.000913, -0.069596],
        [-0.001107, 0.132220],
        [0.054126, 0.048422, 0.070238, -0.001622],
        [0.005034],
    ]
    np.testing.assert_allclose(grad, grad_matrix(expected), atol=TOL)


@pytest.mark.parametrize(
    "options, eps, expected",
    [
        # token mean: Σ per-token losses / 10
        (dict(aggregation="batch_token_mean"), 1e-6, 0.134568),
        # + 0.001 × token-mean k3 0.056379
        (dict(aggregation="batch_token_mean", kl_coef=0.001), 1e-6, 0.134625),
        # Σ per-token losses / 4
        (dict(aggregation="seq_mean_token_sum"), 1e-6, 0.336421),
        # TRL grpo and dapo loss types, ε_A = 1e-4
        (dict(), 1e-4, -0.060081),
        (dict(aggregation="batch_token_mean"), 1e-4, 0.134545),
    ],
)
def test_grpo_variants(options, eps, expected):
    advantages = group_advantages(fx.F_REWARDS[None], "grpo", eps=eps)[0]
    value, _, _ = loss_and_grad("grpo", advantages, **options)
    assert value == pytest.approx(expected, abs=TOL)


# --- 6.3 DAPO -------------------------------------------------------------------------------


def test_dapo_clip_higher_token_mean():
    # ε_high = 0.28: o1t2 (r = 1.246077 < 1.28) is no longer clipped: -0.866024·1.246077 =
    # -1.079132; o4t1 clipped at 1.28: -1.108511. Σ/10 = 0.123650 ≤ GRPO's 0.134568.
    value, grad, _ = loss_and_grad("dapo", f_advantages("grpo"))
    assert value == pytest.approx(0.123650, abs=TOL)
    expected = [
        [-0.095710, -0.107913, -0.082379],
        [0.000000, 0.105776],
        [0.086602, 0.078361, 0.111200, 0.000000],
        [0.000000],
    ]
    np.testing.assert_allclose(grad, grad_matrix(expected), atol=TOL)


# --- 6.4 Dr. GRPO ---------------------------------------------------------------------------


def test_drgrpo():
    # Â = R - R̄ = [0.5, -0.5, -0.5, 0.5]; L = Σ per-token clipped losses / (N_seq·L_max = 16).
    advantages = f_advantages("drgrpo")
    np.testing.assert_allclose(advantages, [0.5, -0.5, -0.5, 0.5], atol=TOL)
    value, grad, _ = loss_and_grad("drgrpo", advantages, max_length=4)
    assert value == pytest.approx(0.048558, abs=TOL)
    # VERL's seq-mean-token-sum-norm divides by L_max = 4 only: ×N_seq = 0.194233.
    assert 4 * value == pytest.approx(0.194233, abs=4 * TOL)
    expected = [
        [-0.034537, 0.000000, -0.029726],
        [0.000000, 0.038169],
        [0.031250, 0.028276, 0.040126, 0.000000],
        [0.000000],
    ]
    np.testing.assert_allclose(grad, grad_matrix(expected), atol=TOL)


def test_drgrpo_rejects_missing_max_length():
    with pytest.raises(ValueError, match="max_length"):
        loss_and_grad("drgrpo", f_advantages("drgrpo"))


# --- 6.5 RLOO -------------------------------------------------------------------------------


def test_rloo_canonical():
    # Baselines (Σ_{j≠i} R_j)/3 = [1/3, 2/3, 2/3, 1/3] → Â = [2/3, -2/3, -2/3, 2/3].
    # L = -(1/4) Σ_i Â_i Σ_t ℓ_it = -(1/4)(2/3)(-3.23 + 1.5 + 5.05 - 0.6) = -0.553333.
    advantages = f_advantages("rloo")
    np.testing.assert_allclose(advantages, [2 / 3, -2 / 3, -2 / 3, 2 / 3], atol=TOL)
    value, grad, _ = loss_and_grad("rloo", advantages)
    assert value == pytest.approx(-0.553333, abs=TOL)
    expected = np.where(fx.F_MASK, -advantages[:, None] / 4, 0.0)
    np.testing.assert_allclose(grad, expected, atol=TOL)


def test_rloo_trl_sequence_product_ratio():
    # ρ_i = exp(Σ_t δ) = exp([0.27, -0.20, -0.15, 0.50]); o1, o4 clipped at 1.2 (A > 0), so
    # L = (1/4)[-(2/3)1.2 + (2/3)0.818731 + (2/3)0.860708 - (2/3)1.2] = -0.120094 and
    # ∂L/∂ℓ = (2/3)ρ_i/4 on o2 (0.136455) and o3 (0.143451).
    value, grad, _ = loss_and_grad(
        "rloo", f_advantages("rloo"), ratio="sequence_product", clip="ppo",
        aggregation="seq_mean_token_mean",
    )
    assert value == pytest.approx(-0.120094, abs=TOL)
    expected = np.where(fx.F_MASK, np.array([0.0, 0.136455, 0.143451, 0.0])[:, None], 0.0)
    np.testing.assert_allclose(grad, expected, atol=TOL)


def test_rloo_verl_token_ratio_token_mean():
    value, _, _ = loss_and_grad(
        "rloo", f_advantages("rloo"), ratio="token", clip="ppo", aggregation="batch_token_mean"
    )
    assert value == pytest.approx(0.103591, abs=TOL)


# --- 6.6 GSPO -------------------------------------------------------------------------------


def test_gspo_symmetric_clip():
    # s_i = exp(mean_t δ) = exp([0.27/3, -0.2/2, -0.15/4, 0.5]) = [1.094174, 0.904837, 0.963194,
    # 1.648721]; only o4 (s > 1.2, A > 0) is clipped. Gradient -Â_i s_i/(G|o_i|), e.g. o1:
    # -0.866024·1.094174/12 = -0.078965.
    value, grad, metrics = loss_and_grad(
        "gspo", f_advantages("grpo"), clip_low=0.2, clip_high=0.2
    )
    assert value == pytest.approx(-0.092262, abs=TOL)
    per_row = np.array([-0.078965, 0.097951, 0.052134, 0.0])
    np.testing.assert_allclose(grad, np.where(fx.F_MASK, per_row[:, None], 0.0), atol=TOL)
    # ratio_max is s_4; the ratio metrics are over the sequence ratio broadcast to tokens.
    assert float(metrics["ratio_max"]) == pytest.approx(1.648721, abs=TOL)


def test_gspo_paper_clip_range_clips_everything():
    # ε = 3e-4/4e-4: every s_i is outside [0.9997, 1.0004], so the gradient vanishes and
    # L = (1/4)[-Â·1.0004 + Â·0.9997·2 - Â·1.0004] = -0.866024·0.0007·2/4 = -0.000303.
    value, grad, _ = loss_and_grad("gspo", f_advantages("grpo"))
    assert value == pytest.approx(-0.000303, abs=TOL)
    np.testing.assert_array_equal(grad, 0.0)


# --- 6.7 CISPO ------------------------------------------------------------------------------


def test_cispo_no_lower_bound():
    # r̂ = min(r, 1.28): o3t3 (1.284025) and o4 (1.648721) are capped. L = -Σ r̂ Â ℓ / 10 and
    # ∂L/∂ℓ = -r̂ Â/10, e.g. o4: -1.28·0.866024/10 = -0.110851.
    value, grad, metrics = loss_and_grad("cispo", f_advantages("grpo"))
    assert value == pytest.approx(-0.201694, abs=TOL)
    expected = [
        [-0.095710, -0.107913, -0.082379],
        [0.058051, 0.105776],
        [0.086602, 0.078361, 0.110851, 0.064157],
        [-0.110851],
    ]
    np.testing.assert_allclose(grad, grad_matrix(expected), atol=TOL)
    assert float(metrics["clip_fraction"]) == pytest.approx(0.2)


@pytest.mark.parametrize(
    "options, expected",
    [
        (dict(clip_high=4.0), -0.182761),  # TRL's absolute cap 5.0 = 1 + 4.0: nothing clipped
        (dict(clip_low=0.2, clip_high=0.2), -0.225778),  # VERL's two-sided default
    ],
)
def test_cispo_clipping_variants(options, expected):
    value, _, _ = loss_and_grad("cispo", f_advantages("grpo"), **options)
    assert value == pytest.approx(expected, abs=TOL)


# --- 6.8 PPO with value head and GAE --------------------------------------------------------


def ppo_advantages():
    # Token rewards: score at the last valid token minus 0.05·k1(old ‖ ref); s1 k1 =
    # [0.1, -0.1, 0, 0.3] → [-0.005, 0.005, 0, 1 - 0.015].
    kl_BT = token_kl(fx.P_LOGP_OLD, fx.P_LOGP_REF, "k1", mask_BT=fx.P_MASK)
    rewards_BT = token_rewards(fx.P_SCORES, fx.P_MASK, penalty_BT=0.05 * kl_BT)
    advantages_BT, returns_BT = gae_advantages(
        rewards_BT, fx.P_VALUES_OLD, fx.P_MASK, gamma=1.0, lam=0.95
    )
    return rewards_BT, advantages_BT, returns_BT


def test_ppo_gae_returns_and_whitening():
    rewards_BT, advantages_BT, returns_BT = ppo_advantages()
    p = lambda rows: fx.padded(rows, fx.P_MASK)  # noqa: E731
    np.testing.assert_allclose(
        rewards_BT, p([[-0.005, 0.005, 0.0, 0.985], [-0.005, 0.0, 0.005]]), atol=TOL
    )
    # s1 t4: δ = 0.985 - 0.7 = 0.285; t3: δ = 0 + 0.7 - 0.6 = 0.1, A = 0.1 + 0.95·0.285 = 0.37075
    np.testing.assert_allclose(
        advantages_BT,
        p([[0.529352, 0.457212, 0.370750, 0.285000], [-0.285737, -0.190250, -0.095000]]),
        atol=TOL,
    )
    np.testing.assert_allclose(
        returns_BT,
        p([[0.929352, 0.957212, 0.970750, 0.985000], [0.014263, 0.009750, 0.005000]]),
        atol=TOL,
    )
    # mean 0.153047, unbiased variance 0.111807 over 7 tokens.
    np.testing.assert_allclose(
        whiten(advantages_BT, fx.P_MASK),
        p([[1.125398, 0.909654, 0.651075, 0.394627], [-1.312251, -1.026681, -0.741822]]),
        atol=TOL,
    )


def ppo_loss(logp_BT, values_BT=None, **options):
    _, advantages_BT, returns_BT = ppo_advantages()
    return policy_loss(
        "ppo",
        logp=logp_BT,
        logp_old=fx.P_LOGP_OLD,
        logp_ref=fx.P_LOGP_REF,
        advantages=whiten(advantages_BT, fx.P_MASK),
        mask=fx.P_MASK,
        values=values_BT,
        values_old=fx.P_VALUES_OLD,
        returns=returns_BT,
        **options,
    )


def test_ppo_policy_loss_dual_clip():
    # s2 t1: r = e^1.2 = 3.320117 > c = 3 with Â = -1.312251 → c|Â| = 3.936754 (4.356828
    # without dual clip). Token mean over 7: 0.347186 (0.407196 without).
    (value, metrics), grad = jax.value_and_grad(ppo_loss, has_aux=True)(jnp.asarray(fx.P_LOGP))
    assert float(value) == pytest.approx(0.347186, abs=TOL)
    expected = fx.padded(
        [[-0.177680, -0.096270, -0.108063, 0.0], [0.0, 0.0, 0.117120]], fx.P_MASK
    )
    np.testing.assert_allclose(grad, expected, atol=TOL)
    # Clipped: s1t4 (upper), s2t1 (dual), s2t2 (lower) → 3 of 7; dual-clipped 1 of 7.
    assert float(metrics["clip_fraction"]) == pytest.approx(3 / 7)
    assert float(metrics["dual_clip_fraction"]) == pytest.approx(1 / 7)
    value_plain, _ = ppo_loss(jnp.asarray(fx.P_LOGP), dual_clip=None)
    assert float(value_plain) == pytest.approx(0.407196, abs=TOL)


def test_ppo_value_loss_and_total():
    # ½·mean of max((V - R̂)², (clip(V, V_old ± 0.2) - R̂)²) over 7 tokens = 0.053521;
    # with ε_v = 0.5 nothing is clipped: ½ MSE = 0.049029.
    _, _, returns_BT = ppo_advantages()
    clipped = value_loss(fx.P_VALUES, fx.P_VALUES_OLD, returns_BT, fx.P_MASK, clip=0.2)
    unclipped = value_loss(fx.P_VALUES, fx.P_VALUES_OLD, returns_BT, fx.P_MASK, clip=0.5)
    assert float(clipped) == pytest.approx(0.053521, abs=TOL)
    assert float(unclipped) == pytest.approx(0.049029, abs=TOL)
    # TRL-style total pg + 0.1·vf = 0.347186 + 0.0053521.
    total, metrics = ppo_loss(jnp.asarray(fx.P_LOGP), jnp.asarray(fx.P_VALUES))
    assert float(total) == pytest.approx(0.352538, abs=TOL)
    assert float(metrics["value_loss"]) == pytest.approx(0.053521, abs=TOL)


# --- 6.9 DPO --------------------------------------------------------------------------------

DPO_LOGP = np.array([[-10.0], [-7.0], [-12.0], [-6.0]])  # chosen rows, then rejected rows
DPO_LOGP_REF = np.array([[-10.5], [-7.2], [-11.0], [-6.5]])


def dpo(logp, **options):
    return preference_loss(
        "dpo", logp=logp, logp_ref=DPO_LOGP_REF, mask=np.ones((4, 1), bool), **options
    )


@pytest.mark.slow
def test_dpo():
    # Chosen log-ratios [0.5, 0.2], rejected [-1.0, 0.5] → Δ = [1.5, -0.3];
    # softplus(-0.15) = 0.620957, softplus(0.03) = 0.708260, mean 0.664608.
    (value, metrics), grad = jax.value_and_grad(dpo, has_aux=True)(jnp.asarray(DPO_LOGP))
    assert float(value) == pytest.approx(0.664608, abs=TOL)
    # ∂L/∂logπ(y⁺) = -β σ(-βΔ)/2 = [-0.023129, -0.025375]; opposite for y⁻.
    np.testing.assert_allclose(
        grad[:, 0], [-0.023129, -0.025375, 0.023129, 0.025375], atol=TOL
    )
    assert float(metrics["reward_accuracy"]) == pytest.approx(0.5)


def test_dpo_label_smoothing_and_zero_margin():
    # 0.9·softplus(-βΔ) + 0.1·softplus(βΔ) = [0.635957, 0.705260], mean 0.670608.
    value, _ = dpo(jnp.asarray(DPO_LOGP), label_smoothing=0.1)
    assert float(value) == pytest.approx(0.670608, abs=TOL)
    zero_margin, _ = dpo(jnp.asarray(DPO_LOGP_REF))
    assert float(zero_margin) == pytest.approx(np.log(2.0), abs=TOL)  # 0.693147


# --- 6.10 KTO -------------------------------------------------------------------------------

KTO_LOGP = np.array([[-12.0], [-8.0], [-15.0], [-9.5]])
KTO_LOGP_REF = np.array([[-12.5], [-8.4], [-14.2], [-9.0]])  # r_θ = [0.5, 0.4, -0.8, -0.5]
KTO_DESIRABLE = np.array([True, True, False, False])


def kto(logp, mismatched_ratios, **options):
    ones = np.ones((4, 1), bool)
    return preference_loss(
        "kto", logp=logp, logp_ref=KTO_LOGP_REF, mask=ones, desirable=KTO_DESIRABLE,
        mismatched_logp=np.asarray(mismatched_ratios)[:, None],
        mismatched_logp_ref=np.zeros((4, 1)), mismatched_mask=ones, **options,
    )


def test_kto():
    # z0 = max(0, mean[0.3, -0.1, 0.4, 0.2]) = 0.2; losses 1 - σ(0.1·[0.3, 0.2]) for D and
    # 1 - σ(0.1·[1.0, 0.7]) for U = [0.492501, 0.495000, 0.475021, 0.482507].
    fn = lambda lp: kto(lp, [0.3, -0.1, 0.4, 0.2])  # noqa: E731
    (value, metrics), grad = jax.value_and_grad(fn, has_aux=True)(jnp.asarray(KTO_LOGP))
    assert float(metrics["reference_point"]) == pytest.approx(0.2, abs=TOL)
    assert float(value) == pytest.approx(0.486257, abs=TOL)
    np.testing.assert_allclose(
        grad[:, 0], [-0.006249, -0.006249, 0.006234, 0.006242], atol=TOL
    )


def test_kto_reference_point_clamped_at_zero_and_weights():
    value, metrics = kto(jnp.asarray(KTO_LOGP), [-0.3, 0.1, -0.2, 0.0])  # mean -0.1 → z0 = 0
    assert float(metrics["reference_point"]) == 0.0
    assert float(value) == pytest.approx(0.486254, abs=TOL)
    weighted, _ = kto(jnp.asarray(KTO_LOGP), [0.3, -0.1, 0.4, 0.2], desirable_weight=1.33)
    assert float(weighted) == pytest.approx(0.567726, abs=TOL)
