"""DAPO dynamic sampling and soft overlong punishment (examples E-DS, E-OL; P17, P18)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.advantages import group_advantages
from kernels.errors import ObjectiveConfigError
from kernels.reward_shaping import dynamic_sampling_keep, overlong_penalty

EXAMPLES = settings(max_examples=max(10, settings.default.max_examples // 5))


def test_example_dynamic_sampling():
    groups = np.array([[1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 0], [0.5, 0.5, 0, 0.5]])
    np.testing.assert_array_equal(dynamic_sampling_keep(groups), [True, False, False, True])
    np.testing.assert_array_equal(dynamic_sampling_keep(np.array([[0.0], [1.0]])), [True, True])


@EXAMPLES
@given(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=24, max_size=24))
def test_kept_groups_carry_signal(flat):
    rewards = np.array(flat).reshape(6, 4)
    keep = np.asarray(dynamic_sampling_keep(rewards))
    assert np.all(rewards[keep].std(axis=1) > 0)
    advantages = np.asarray(group_advantages(rewards, "grpo"))
    assert np.all(np.any(advantages[keep] != 0, axis=1))
    np.testing.assert_array_equal(advantages[~keep], 0.0)  # dropped groups had no signal


@pytest.mark.parametrize(
    "length, paper, verl",
    [
        (16000, 0.0, 0.0),
        (16384, 0.0, 0.0),  # L_max - L_cache = 20480 - 4096
        (16385, -0.000244, -0.000244),  # -1/4096
        (18432, -0.5, -0.5),
        (20480, -1.0, -1.0),
        (21000, -1.0, -1.126953),  # (16384 - 21000)/4096, uncapped
    ],
)
def test_example_overlong(length, paper, verl):
    kw = dict(max_length=20480, buffer_length=4096)
    assert float(overlong_penalty(np.array([length]), **kw)[0]) == pytest.approx(paper, abs=1e-6)
    uncapped = overlong_penalty(np.array([length]), capped=False, **kw)
    assert float(uncapped[0]) == pytest.approx(verl, abs=1e-6)


@EXAMPLES
@given(st.integers(1, 64), st.data())
def test_overlong_penalty_shape(max_length, data):
    buffer_length = data.draw(st.integers(1, max_length))
    lengths = np.arange(0, 70)  # one shape for every example
    penalty = np.asarray(overlong_penalty(lengths, max_length=max_length,
                                          buffer_length=buffer_length))
    assert np.all((penalty >= -1.0) & (penalty <= 0.0))
    assert np.all(np.diff(penalty) <= 0.0)
    assert np.all(penalty[lengths <= max_length - buffer_length] == 0.0)
    assert penalty[max_length] == -1.0


def test_bad_shaping_input_is_rejected():
    with pytest.raises(ObjectiveConfigError, match="buffer_length must be in"):
        overlong_penalty(np.array([1]), max_length=10, buffer_length=11)
    with pytest.raises(ObjectiveConfigError, match=r"shape \[M, G\]"):
        dynamic_sampling_keep(np.ones(3))
