"""Advantage estimators: GRPO, Dr. GRPO, RLOO, REINFORCE and GAE (spec §4, P5, P6, P13)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.advantages import gae_advantages, group_advantages, token_rewards, whiten
from kernels.errors import ObjectiveConfigError

EXAMPLES = settings(max_examples=max(10, settings.default.max_examples // 5))


@pytest.fixture(autouse=True)
def _float64():
    with jax.enable_x64(True):
        yield


@st.composite
def group_rewards(draw, min_group=2):
    groups, size = draw(st.sampled_from([(1, max(min_group, 1)), (1, 2), (2, 4), (3, 5)]))
    # Few distinct values make ties and constant groups common, as with 0/1 correctness.
    values = st.sampled_from([0.0, 0.25, 0.5, 1.0, -1.0, 3.0])
    flat = draw(st.lists(values, min_size=groups * size, max_size=groups * size))
    return np.array(flat).reshape(groups, size)


def test_reinforce_with_and_without_baseline():
    rewards = np.array([[1.0, 0.0, 0.0, 1.0]])
    np.testing.assert_array_equal(group_advantages(rewards, "reinforce"), rewards)
    np.testing.assert_allclose(
        group_advantages(rewards, "reinforce", baseline=0.5), [[0.5, -0.5, -0.5, 0.5]]
    )


@pytest.mark.slow
@EXAMPLES
@given(group_rewards())
def test_grpo_advantages_are_centred_and_unit_std(rewards_MG):
    advantages = np.asarray(group_advantages(rewards_MG, "grpo", eps=0.0))
    np.testing.assert_allclose(advantages.sum(axis=1), 0.0, atol=1e-12)
    varied = rewards_MG.max(axis=1) > rewards_MG.min(axis=1)
    np.testing.assert_allclose(advantages[varied].std(axis=1, ddof=1), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(advantages[~varied], 0.0)  # constant group: exactly 0


@EXAMPLES
@given(group_rewards(), st.floats(0.1, 10.0), st.floats(-5.0, 5.0))
def test_grpo_advantages_are_affine_invariant(rewards_MG, scale, shift):
    base = group_advantages(rewards_MG, "grpo", eps=0.0)
    moved = group_advantages(scale * rewards_MG + shift, "grpo", eps=0.0)
    np.testing.assert_allclose(moved, base, atol=1e-9)


@EXAMPLES
@given(group_rewards(), st.randoms(use_true_random=False))
def test_group_advantages_are_permutation_equivariant(rewards_MG, rng):
    order = list(range(rewards_MG.shape[1]))
    rng.shuffle(order)
    for estimator in ("grpo", "drgrpo", "rloo"):
        np.testing.assert_allclose(
            group_advantages(rewards_MG[:, order], estimator),
            np.asarray(group_advantages(rewards_MG, estimator))[:, order],
            atol=1e-12,
        )


@EXAMPLES
@given(group_rewards(), st.floats(0.1, 10.0), st.floats(-5.0, 5.0))
def test_drgrpo_and_rloo(rewards_MG, scale, shift):
    size = rewards_MG.shape[1]
    dr = np.asarray(group_advantages(rewards_MG, "drgrpo"))
    rloo = np.asarray(group_advantages(rewards_MG, "rloo"))
    np.testing.assert_allclose(dr.sum(axis=1), 0.0, atol=1e-12)
    np.testing.assert_allclose(rloo.sum(axis=1), 0.0, atol=1e-12)
    np.testing.assert_allclose(rloo, size / (size - 1) * dr, atol=1e-12)
    # Leave-one-out written out: R_i - Σ_{j≠i} R_j / (G - 1).
    others = (rewards_MG.sum(axis=1, keepdims=True) - rewards_MG) / (size - 1)
    np.testing.assert_allclose(rloo, rewards_MG - others, atol=1e-12)
    for estimator, base in (("drgrpo", dr), ("rloo", rloo)):
        moved = group_advantages(scale * rewards_MG + shift, estimator)
        np.testing.assert_allclose(moved, scale * base, atol=1e-9)


def test_rloo_pair_is_the_reward_difference():
    rewards = np.array([[0.75, 0.25], [0.0, 1.0]])
    np.testing.assert_allclose(
        group_advantages(rewards, "rloo"), [[0.5, -0.5], [-1.0, 1.0]]
    )


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: group_advantages(np.ones((2, 3)), "grpoo"), "'grpoo'; accepted: reinforce"),
        (lambda: group_advantages(np.ones((2, 3)), "gae"), "use gae_advantages"),
        (lambda: group_advantages(np.ones((2, 1)), "grpo"), "at least 2 responses, got G=1"),
        (lambda: group_advantages(np.ones(3), "rloo"), r"shape \[M, G\]"),
        (lambda: group_advantages(np.ones((1, 2)), "rloo", baseline=1.0), "only taken by"),
    ],
)
def test_bad_estimator_input_is_rejected(call, message):
    with pytest.raises(ObjectiveConfigError, match=message):
        call()


def test_token_rewards_place_the_score_at_the_last_valid_token():
    mask = np.array([[1, 1, 1, 0], [0, 0, 0, 0], [1, 0, 1, 0]], bool)
    rewards = token_rewards(np.array([2.0, 5.0, 3.0]), mask)
    np.testing.assert_array_equal(rewards, [[0, 0, 2, 0], [0, 0, 0, 0], [0, 0, 3, 0]])


@st.composite
def trajectories(draw):
    # A few shapes only: every new shape costs a compilation, while the values vary freely.
    rows, width = draw(st.sampled_from([(1, 1), (2, 5), (3, 6)]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    mask = rng.random((rows, width)) < 0.75
    return rng.normal(size=(rows, width)), rng.normal(size=(rows, width)), mask


def reference_gae(rewards, values, mask, gamma, lam):
    """The textbook recursion on each row's unmasked positions only."""
    advantages = np.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        steps = np.flatnonzero(mask[i])
        next_value, carry = 0.0, 0.0
        for t in steps[::-1]:
            carry = rewards[i, t] + gamma * next_value - values[i, t] + gamma * lam * carry
            advantages[i, t], next_value = carry, values[i, t]
    return advantages


@EXAMPLES
@given(trajectories(), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_gae_matches_the_recursion_on_valid_steps(data, gamma, lam):
    rewards, values, mask = data
    garbage = np.where(mask, rewards, np.nan), np.where(mask, values, np.inf)
    advantages, returns = gae_advantages(*garbage, mask, gamma=gamma, lam=lam)
    expected = reference_gae(rewards, values, mask, gamma, lam)
    np.testing.assert_allclose(advantages, expected, atol=1e-10)
    np.testing.assert_allclose(returns, np.where(mask, expected + values, 0.0), atol=1e-10)


@EXAMPLES
@given(trajectories())
def test_gae_limits(data):
    rewards, values, mask = data
    # γ = λ = 1: A_t = Σ_{k≥t} r_k - V_t over valid steps; R̂_t = Σ_{k≥t} r_k.
    advantages, returns = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    masked = np.where(mask, rewards, 0.0)
    to_go = np.cumsum(masked[:, ::-1], axis=1)[:, ::-1]
    np.testing.assert_allclose(returns, np.where(mask, to_go, 0.0), atol=1e-10)
    np.testing.assert_allclose(advantages, np.where(mask, to_go - values, 0.0), atol=1e-10)
    # λ = 0: A_t = δ_t = r_t + γ V_next - V_t.
    advantages, _ = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.0)
    np.testing.assert_allclose(
        advantages, reference_gae(rewards, values, mask, 0.9, 0.0), atol=1e-10
    )


@EXAMPLES
@given(trajectories(), st.integers(0, 5))
def test_gae_ignores_inserted_masked_steps(data, where):
    rewards, values, mask = data
    column = min(where, rewards.shape[1])
    insert = lambda x, v: np.insert(x, column, v, axis=1)  # noqa: E731
    base, _ = gae_advantages(rewards, values, mask, gamma=0.97, lam=0.9)
    padded, _ = gae_advantages(
        insert(rewards, 7.0), insert(values, np.nan), insert(mask, False), gamma=0.97, lam=0.9
    )
    np.testing.assert_allclose(np.delete(np.asarray(padded), column, axis=1), base, atol=1e-12)


@EXAMPLES
@given(trajectories())
def test_whitening_has_zero_mean_and_unit_variance(data):
    rewards, _, mask = data
    count = mask.sum()
    whitened = np.asarray(whiten(jnp.asarray(rewards), mask))
    assert np.all(whitened[~mask] == 0.0)
    if count >= 2:
        variance = np.var(rewards[mask], ddof=1)
        assert whitened[mask].mean() == pytest.approx(0.0, abs=1e-10)
        expected = variance / (variance + 1e-8)
        assert np.var(whitened[mask], ddof=1) == pytest.approx(expected, rel=1e-10)
