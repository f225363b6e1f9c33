"""KL estimators and their placements (spec §5, example K1, P10)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.errors import ObjectiveConfigError
from kernels.kl import KL_ESTIMATORS, kl_penalized_rewards, sequence_kl, token_kl

EXAMPLES = settings(max_examples=max(10, settings.default.max_examples // 5))


@pytest.fixture(autouse=True)
def _float64():
    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize(
    "estimator, value, slope",
    [
        ("k1", 0.200000, 1.0),  # ℓ - ℓ_ref = -1.0 + 1.2
        ("k2", 0.020000, 0.200000),  # ½·0.2², slope 0.2
        ("k3", 0.018731, 0.181269),  # d = -0.2: e^-0.2 + 0.2 - 1, slope 1 - e^-0.2
    ],
)
def test_example_k1(estimator, value, slope):
    fn = lambda logp: token_kl(logp, jnp.asarray(-1.2), estimator)  # noqa: E731
    assert float(fn(jnp.asarray(-1.0))) == pytest.approx(value, abs=1e-6)
    assert float(jax.grad(fn)(jnp.asarray(-1.0))) == pytest.approx(slope, abs=1e-6)


def test_example_k1_swapped():
    # ℓ = -1.2, ℓ_ref = -1.0: k1 = -0.2, k3 = e^0.2 - 0.2 - 1 = 0.021403.
    assert float(token_kl(-1.2, -1.0, "k1")) == pytest.approx(-0.2, abs=1e-6)
    assert float(token_kl(-1.2, -1.0, "k3")) == pytest.approx(0.021403, abs=1e-6)


log_probs = st.lists(st.floats(-15.0, 0.0), min_size=6, max_size=6).map(np.array)


@EXAMPLES
@given(log_probs, log_probs)
def test_k3_is_nonnegative_and_zero_only_at_equality(logp, logp_ref):
    kl = np.asarray(token_kl(logp, logp_ref, "k3"))
    assert np.all(kl >= 0.0)
    assert np.all(kl[logp == logp_ref] == 0.0)
    assert np.all(kl[np.abs(logp - logp_ref) > 1e-6] > 0.0)


@EXAMPLES
@given(log_probs)
def test_all_estimators_and_gradients_vanish_at_the_reference(logp):
    # Spec P10 says all three gradients vanish, but its own table (and §8 D5) gives k1 the
    # constant slope 1: only k2 and k3 are stationary at ℓ = ℓ_ref.
    for estimator, slope in (("k1", 1.0), ("k2", 0.0), ("k3", 0.0)):
        fn = lambda x: jnp.sum(token_kl(x, logp, estimator))  # noqa: E731, B023
        assert float(fn(jnp.asarray(logp))) == 0.0
        np.testing.assert_allclose(jax.grad(fn)(jnp.asarray(logp)), slope, atol=1e-12)


def test_masked_positions_reach_neither_value_nor_gradient():
    mask = np.array([[True, False, True]])
    logp = jnp.array([[-1.0, jnp.nan, -0.5]])
    logp_ref = jnp.array([[-1.5, jnp.inf, -0.7]])
    for estimator in KL_ESTIMATORS:
        fn = lambda x: jnp.sum(token_kl(x, logp_ref, estimator, mask_BT=mask))  # noqa: E731, B023
        value, grad = jax.value_and_grad(fn)(logp)
        assert np.isfinite(value)
        assert grad[0, 1] == 0.0 and np.all(np.isfinite(grad))


def test_kl_in_reward_has_no_gradient_and_subtracts_beta_kl():
    mask = np.array([[True, True, False]])
    rewards = np.array([[0.0, 1.0, np.nan]])
    logp_ref = np.array([[-0.6, -0.9, np.nan]])

    def shaped_sum(logp_old):
        return jnp.sum(
            kl_penalized_rewards(rewards, logp_old, logp_ref, mask, coef=0.05, estimator="k1")
        )

    logp_old = jnp.array([[-0.5, -1.0, jnp.inf]])
    # k1 = [0.1, -0.1] → rewards [0 - 0.005, 1 + 0.005].
    assert float(shaped_sum(logp_old)) == pytest.approx(1.0)
    np.testing.assert_array_equal(jax.grad(shaped_sum)(logp_old), 0.0)
    assert float(sequence_kl(logp_old, logp_ref, mask)[0]) == pytest.approx(0.0, abs=1e-12)


def test_unknown_estimator_is_rejected():
    with pytest.raises(ObjectiveConfigError, match="'k4'; accepted: k1, k2, k3"):
        token_kl(0.0, 0.0, "k4")
