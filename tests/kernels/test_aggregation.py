"""Aggregation modes and their global normalisers (spec §3, test A1, P7, P8, P9)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.aggregation import AGGREGATIONS, aggregate, batch_totals, token_weights
from kernels.errors import ObjectiveConfigError

EXAMPLES = settings(max_examples=max(10, settings.default.max_examples // 5))
GROUP = 2
OPTIONS = dict(max_length=8, group_size=GROUP)


@pytest.fixture(autouse=True)
def _float64():
    with jax.enable_x64(True):
        yield


def mask_from_lengths(lengths, width):
    return np.arange(width)[None, :] < np.asarray(lengths)[:, None]


def test_a1_group_versus_batch_token_mean():
    # Group 1 lengths [3, 2, 4, 1] (Σ 10), group 2 [1, 2, 2, 1] (Σ 6), M = 2:
    # group_token_mean 1/(2·10) = 0.05 and 1/(2·6) = 0.083333; batch_token_mean 1/16 = 0.0625.
    mask = mask_from_lengths([3, 2, 4, 1, 1, 2, 2, 1], 4)
    group = token_weights(mask, "group_token_mean", group_size=4)
    batch = token_weights(mask, "batch_token_mean")
    np.testing.assert_allclose(group[:, 0], [0.05] * 4 + [1 / 12] * 4)
    np.testing.assert_allclose(np.asarray(batch)[mask], 0.0625)
    np.testing.assert_array_equal(np.asarray(group)[~mask], 0.0)


def test_weights_of_every_mode_on_fixture_f():
    # Lengths [3, 2, 4, 1], N_seq = 4, Σ|o| = 10, L_max = 4.
    mask = mask_from_lengths([3, 2, 4, 1], 4)
    expected = {
        "seq_mean_token_mean": [1 / 12, 1 / 8, 1 / 16, 1 / 4],
        "batch_token_mean": [0.1] * 4,
        "group_token_mean": [0.1] * 4,  # one group: Σ over the group = the batch
        "seq_mean_token_sum": [0.25] * 4,
        "max_length_mean": [1 / 16] * 4,
    }
    for mode, rows in expected.items():
        weights = token_weights(mask, mode, max_length=4, group_size=4)
        np.testing.assert_allclose(weights, np.where(mask, np.array(rows)[:, None], 0.0))


@st.composite
def batches(draw):
    # One shape (every new shape costs compilations); lengths, including empty rows, vary.
    groups = 3
    lengths = draw(st.lists(st.integers(0, 5), min_size=groups * GROUP, max_size=groups * GROUP))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    values = rng.normal(size=(len(lengths), 5))
    return mask_from_lengths(lengths, 5), values


@EXAMPLES
@given(batches())
def test_padding_columns_change_no_mode(batch):
    mask, values = batch
    extra = 3
    wide_mask = np.pad(mask, ((0, 0), (0, extra)))
    wide_values = np.pad(values, ((0, 0), (0, extra)), constant_values=np.nan)
    for mode in AGGREGATIONS:
        narrow = aggregate(values, mask, mode, **OPTIONS)
        wide = aggregate(wide_values, wide_mask, mode, **OPTIONS)
        assert float(wide) == pytest.approx(float(narrow), abs=1e-12), mode


@EXAMPLES
@given(st.integers(1, 5), st.integers(0, 2**32 - 1))
def test_identities_at_equal_lengths(length, seed):
    groups = 3
    values = np.random.default_rng(seed).normal(size=(groups * GROUP, 5))
    mask = mask_from_lengths([length] * (groups * GROUP), 5)
    seq = aggregate(values, mask, "seq_mean_token_mean")
    assert float(aggregate(values, mask, "batch_token_mean")) == pytest.approx(float(seq))
    group = aggregate(values, mask, "group_token_mean", group_size=GROUP)
    assert float(group) == pytest.approx(float(seq))


@EXAMPLES
@given(batches())
def test_identities_at_any_lengths(batch):
    mask, values = batch
    per_sequence = aggregate(values, mask, "seq_mean_token_sum")
    scaled = aggregate(values, mask, "max_length_mean", max_length=8)
    assert float(scaled) == pytest.approx(float(per_sequence) / 8, abs=1e-12)
    one_group = aggregate(values, mask, "group_token_mean", group_size=mask.shape[0])
    assert float(one_group) == pytest.approx(float(aggregate(values, mask, "batch_token_mean")))


@EXAMPLES
@given(batches(), st.data())
def test_pieces_with_global_totals_sum_to_the_whole(batch, data):
    mask, values = batch
    groups = mask.shape[0] // GROUP
    cut = GROUP * data.draw(st.integers(0, groups))  # pieces hold whole groups
    pieces = [(values[:cut], mask[:cut]), (values[cut:], mask[cut:])]
    totals = jax.tree.map(
        jnp.add, *(batch_totals(piece_mask, group_size=GROUP) for _, piece_mask in pieces)
    )
    for mode in AGGREGATIONS:
        whole = aggregate(values, mask, mode, **OPTIONS)
        summed = sum(
            float(aggregate(v, m, mode, totals=totals, **OPTIONS)) for v, m in pieces
        )
        assert summed == pytest.approx(float(whole), abs=1e-12), mode


def test_empty_rows_and_batches_get_no_weight():
    mask = mask_from_lengths([0, 2], 3)
    np.testing.assert_allclose(
        token_weights(mask, "seq_mean_token_mean"), [[0, 0, 0], [0.5, 0.5, 0]]
    )
    for mode in AGGREGATIONS:
        empty = token_weights(np.zeros((2, 3), bool), mode, **OPTIONS)
        np.testing.assert_array_equal(empty, 0.0)


@pytest.mark.parametrize(
    "mode, options, message",
    [
        ("token_mean", {}, "'token_mean'; accepted: seq_mean_token_mean"),
        ("max_length_mean", {}, "needs max_length >= 1.*got None"),
        ("group_token_mean", {}, "needs group_size"),
        ("group_token_mean", dict(group_size=3), "group_size 3 does not divide the 4 rows"),
    ],
)
def test_bad_aggregation_is_rejected(mode, options, message):
    with pytest.raises(ObjectiveConfigError, match=message):
        token_weights(np.ones((4, 2), bool), mode, **options)
