"""Named RNG streams: pure functions of (seed, purpose, indices), stable across processes."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from runtime import rng
from runtime.errors import UsageError


def test_keys_depend_on_every_input_and_nothing_else():
    base = rng.key(7, "rollout.seed", 1, 2, 3)
    assert rng.key(7, "rollout.seed", 1, 2, 3) == base
    others = {rng.key(8, "rollout.seed", 1, 2, 3), rng.key(7, "data.shuffle", 1, 2, 3),
              rng.key(7, "rollout.seed", 1, 2, 4), rng.key(7, "rollout.seed", 1, 2), rng.key(7, "rollout.seed", 12, 3)}
    assert base not in others and len(others) == 5


def test_known_value_is_stable_across_processes():
    code = "from runtime import rng; print(rng.derive_seed(7, 'rollout.seed', 1, 2, 3))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert int(out) == rng.derive_seed(7, "rollout.seed", 1, 2, 3)
    assert 0 <= int(out) < 2**63


def test_epoch_permutations_visit_every_item_once_and_differ_per_epoch():
    p0, p1 = rng.epoch_permutation(3, 0, 50), rng.epoch_permutation(3, 1, 50)
    assert sorted(p0) == list(range(50)) and sorted(p1) == list(range(50))
    assert not np.array_equal(p0, p1)
    stream = [rng.stream_prompt(3, 50, pos) for pos in range(100)]
    assert [e for e, _ in stream] == [0] * 50 + [1] * 50
    assert [i for _, i in stream[:50]] == list(p0) and [i for _, i in stream[50:]] == list(p1)


def test_generators_are_independent_of_call_order():
    a = rng.generator(1, "x", 0).random(4)
    rng.generator(1, "x", 1).random(100)
    assert np.array_equal(rng.generator(1, "x", 0).random(4), a)


def test_resample_prompts_are_in_range_and_vary():
    draws = {rng.resample_prompt(5, 10, 3, o) for o in range(40)}
    assert draws <= set(range(10)) and len(draws) > 5


@pytest.mark.parametrize("seed", [-1, 2**64, 1.5, True, "3"])
def test_bad_seeds_are_rejected_with_the_value(seed):
    with pytest.raises(UsageError, match="seed"):
        rng.key(seed, "x")


@pytest.mark.parametrize("seed,batch,ordinal", [(0, 1, 0), (7, 3, 5), (2**64 - 1, 10**6, 31)])
def test_group_seeds_equal_the_seeds_one_by_one(seed, batch, ordinal):
    assert rng.rollout_seeds(seed, batch, ordinal, 9) == tuple(rng.rollout_seed(seed, batch, ordinal, i) for i in range(9))
