"""Every objective under jit and grad, with float32 and bfloat16 inputs and NaN padding."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.advantages import group_advantages
from kernels.algorithms import POLICY_ALGORITHMS
from kernels.objectives import configure, policy_loss, preference_loss
from tests.kernels import objective_fixtures as fx

OPTIONS = {"drgrpo": dict(max_length=4), "gspo": dict(clip_low=0.2, clip_high=0.2)}


def f_inputs(dtype):
    advantages = group_advantages(fx.F_REWARDS[None].astype(np.float32), "grpo")[0]
    cast = lambda x: jnp.asarray(x, dtype)  # noqa: E731
    return dict(logp=cast(fx.F_LOGP), logp_old=cast(fx.F_LOGP_OLD),
                logp_ref=cast(fx.F_LOGP_REF), advantages=advantages.astype(dtype),
                mask=fx.F_MASK)


def loss_and_grad(algorithm, inputs, transform=lambda f: f):
    config = configure(algorithm, **OPTIONS.get(algorithm, {}))

    def loss(logp, rest):
        return policy_loss(config, logp=logp, **rest)[0]

    rest = {k: v for k, v in inputs.items() if k != "logp"}
    return transform(jax.value_and_grad(loss))(inputs["logp"], rest)


@pytest.mark.parametrize("algorithm", POLICY_ALGORITHMS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_jit_matches_eager_in_each_dtype(algorithm, dtype):
    inputs = f_inputs(dtype)
    eager_loss, eager_grad = loss_and_grad(algorithm, inputs)
    jit_loss, jit_grad = loss_and_grad(algorithm, inputs, jax.jit)
    assert eager_loss.dtype == jnp.float32  # computed in float32 whatever the input
    assert eager_grad.dtype == dtype  # the cotangent comes back in the input's dtype
    assert np.isfinite(float(jit_loss)) and np.all(np.isfinite(np.asarray(jit_grad, np.float32)))
    assert float(jit_loss) == pytest.approx(float(eager_loss), rel=1e-6, abs=1e-7)
    np.testing.assert_allclose(np.asarray(jit_grad, np.float32),
                               np.asarray(eager_grad, np.float32), rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(np.asarray(jit_grad, np.float32)[~fx.F_MASK], 0.0)


@pytest.mark.parametrize("algorithm", POLICY_ALGORITHMS)
def test_bfloat16_inputs_are_computed_in_float32(algorithm):
    # The same (bf16-rounded) numbers in float32 give the same loss and, rounded to bf16,
    # the same gradient: the kernel upcasts before any arithmetic.
    low = f_inputs(jnp.bfloat16)
    high = {k: (v.astype(jnp.float32) if k != "mask" else v) for k, v in low.items()}
    low_loss, low_grad = loss_and_grad(algorithm, low, jax.jit)
    high_loss, high_grad = loss_and_grad(algorithm, high, jax.jit)
    assert float(low_loss) == float(high_loss)
    np.testing.assert_array_equal(low_grad, high_grad.astype(jnp.bfloat16))


def test_float32_reproduces_the_worked_example():
    loss, grad = loss_and_grad("dapo", f_inputs(jnp.float32), jax.jit)
    assert float(loss) == pytest.approx(0.123650, abs=2e-6)
    assert float(grad[1, 1]) == pytest.approx(0.105776, abs=2e-6)


def test_policy_loss_jits_with_the_configuration_static():
    inputs = f_inputs(jnp.float32)
    jitted = jax.jit(functools.partial(policy_loss, configure("grpo")))
    loss, metrics = jitted(**inputs)
    assert float(loss) == pytest.approx(-0.060091, abs=2e-6)
    assert set(metrics) >= {"clip_fraction", "approx_kl", "ratio_mean", "ratio_min",
                            "ratio_max", "policy_loss", "kl_loss"}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_preference_losses_under_jit_and_grad(dtype):
    mask = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], bool)
    logp = jnp.asarray(np.where(mask, -1.5, np.nan), dtype)
    logp_ref = jnp.asarray(np.where(mask, -1.2, np.inf), dtype)

    @jax.jit
    def both(logp):
        dpo, _ = preference_loss("dpo", logp=logp, logp_ref=logp_ref, mask=mask)
        kto, _ = preference_loss("kto", logp=logp, logp_ref=logp_ref, mask=mask,
                                 desirable=np.array([1, 0, 1, 0], bool), reference_point=0.1)
        return dpo + kto

    value, grad = jax.value_and_grad(both)(logp)
    assert grad.dtype == dtype and np.isfinite(float(value))
    grad32 = np.asarray(grad, np.float32)
    assert np.all(np.isfinite(grad32)) and np.all(grad32[~mask] == 0.0)
