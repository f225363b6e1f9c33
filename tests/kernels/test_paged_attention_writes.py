"""Writing keys/values into pages: the right page and slot, nothing for invalid tokens."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from kernels.kv_pages import page_slots, write_pages

K, N, S, D = 2, 6, 4, 3


def test_page_slots_by_hand():
    table = np.array([[5, 2, 0], [1, 3, 4]], np.int32)
    positions = np.array([[0, 4, 7], [9, 11, 12]], np.int32)
    valid = np.array([[True, True, True], [True, False, True]])
    page, slot = page_slots(positions, table, valid, page_size=S, total_pages=N)
    # seq 0: pos 0 -> logical 0 -> page 5 slot 0; pos 4 -> logical 1 -> page 2 slot 0;
    #        pos 7 -> logical 1 -> page 2 slot 3.
    # seq 1: pos 9 -> logical 2 -> page 4 slot 1; pos 11 invalid -> N; pos 12 is past the
    #        table (3 pages * 4 = 12 slots) -> N.
    np.testing.assert_array_equal(page, [[5, 2, 2], [4, N, N]])
    np.testing.assert_array_equal(slot, [[0, 0, 3], [1, 3, 0]])


@pytest.mark.parametrize("use_jit", [False, True])
def test_prefill_write_places_each_valid_token_and_drops_padding(use_jit):
    rng = np.random.default_rng(0)
    pages = np.full((K, N, S, D), np.nan, np.float32)
    new = rng.normal(size=(2, 6, K, D)).astype(np.float32)
    positions = np.broadcast_to(np.arange(6, dtype=np.int32), (2, 6))
    lengths = np.array([6, 3])
    valid = positions < lengths[:, None]
    table = np.array([[4, 1], [2, 0]], np.int32)
    fn = jax.jit(write_pages) if use_jit else write_pages
    out = np.asarray(fn(pages, new, positions, table, valid))
    expected = pages.copy()
    for b in range(2):
        for t in range(lengths[b]):
            expected[:, table[b, t // S], t % S] = new[b, t]
    np.testing.assert_array_equal(out, expected)  # NaN == NaN where nothing was written
    assert np.isnan(out[:, 0]).all() and np.isnan(out[:, 2, 3:]).all()  # padding dropped


def test_decode_write_one_token_per_slot():
    pages = np.zeros((K, N, S, D), np.float32)
    new = np.arange(3 * K * D, dtype=np.float32).reshape(3, 1, K, D) + 1
    positions = np.array([[5], [0], [-1]], np.int32)  # slot 2 is empty
    table = np.array([[3, 1], [2, 0], [0, 0]], np.int32)
    out = np.asarray(write_pages(pages, new, positions, table, positions >= 0))
    np.testing.assert_array_equal(out[:, 1, 1], new[0, 0])  # pos 5 -> logical 1 -> page 1 slot 1
    np.testing.assert_array_equal(out[:, 2, 0], new[1, 0])
    assert np.count_nonzero(out) == 2 * K * D  # the empty slot wrote nothing, not even page 0


def test_write_casts_to_cache_dtype():
    pages = np.zeros((K, N, S, D), jax.numpy.bfloat16)
    new = np.full((1, 1, K, D), 1.0 / 3.0, np.float32)
    out = write_pages(
        pages, new, np.zeros((1, 1), np.int32), np.ones((1, 1), np.int32), np.ones((1, 1), bool)
    )
    assert out.dtype == jax.numpy.bfloat16
    assert float(out[0, 1, 0, 0]) == float(jax.numpy.bfloat16(1.0 / 3.0))
