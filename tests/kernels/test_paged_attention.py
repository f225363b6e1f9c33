"""Paged decode attention: reference and Pallas kernel against an obvious per-sequence oracle."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels.attention import causal_mask, dense_attention
from kernels.paged_attention import paged_attention, paged_attention_reference

# Shapes shared by most tests: 8 query heads over 2 kv heads (GQA 4:1), pages of 4 tokens,
# 3 pages per sequence (max length 12), 24 physical pages, page 0 the null page.
H, K, D, S, P, N = 8, 2, 16, 4, 3, 24
SCALE = D**-0.5
EDGE_LENGTHS = (0, 1, S - 1, S, S + 1, P * S)  # empty, one token, page boundary ±1, full


def oracle(q_BHD, k_BLKD, v_BLKD, lengths_B, scale):
    """Attention of each sequence's query over its first ``length`` keys, in float64 numpy."""
    q, k, v = (np.asarray(x, np.float64) for x in (q_BHD, k_BLKD, v_BLKD))
    B, Hq, Dq = q.shape
    group = Hq // k.shape[2]
    out = np.zeros((B, Hq, Dq))
    for b in range(B):
        n = int(lengths_B[b])
        for h in range(Hq):
            if n == 0:
                continue
            s = scale * k[b, :n, h // group] @ q[b, h]
            w = np.exp(s - s.max())
            out[b, h] = (w / w.sum()) @ v[b, :n, h // group]
    return out


def make_case(seed, lengths, fill=0.0):
    """Random q, contiguous per-sequence K/V, and the same K/V scattered over random pages.

    Pages a sequence does not own, and slots past its length, hold ``fill``.
    """
    rng = np.random.default_rng(seed)
    B = len(lengths)
    q = rng.normal(size=(B, H, D)).astype(np.float32)
    k_seq = rng.normal(size=(B, P * S, K, D)).astype(np.float32)
    v_seq = rng.normal(size=(B, P * S, K, D)).astype(np.float32)
    physical = 1 + rng.permutation(N - 1)[: B * P].reshape(B, P)  # distinct, random order
    k_pages = np.full((K, N, S, D), fill, np.float32)
    v_pages = np.full((K, N, S, D), fill, np.float32)
    page_indices = np.zeros((B, P), np.int32)  # padding entries point at the null page
    for b, n in enumerate(lengths):
        for p in range(-(-n // S)):
            page_indices[b, p] = physical[b, p]
            for s in range(S):
                if p * S + s < n:
                    k_pages[:, physical[b, p], s] = k_seq[b, p * S + s]
                    v_pages[:, physical[b, p], s] = v_seq[b, p * S + s]
    return q, k_seq, v_seq, k_pages, v_pages, np.asarray(lengths, np.int32), page_indices


@pytest.mark.parametrize("use_jit", [False, True])
def test_reference_matches_oracle_at_edge_lengths(use_jit):
    q, k_seq, v_seq, k_pages, v_pages, lengths, table = make_case(0, EDGE_LENGTHS)
    fn = paged_attention_reference
    if use_jit:
        fn = jax.jit(fn, static_argnames="scale")
    out = np.asarray(fn(q, k_pages, v_pages, lengths, table, scale=SCALE))
    expected = oracle(q, k_seq, v_seq, lengths, SCALE)
    np.testing.assert_allclose(out, expected, atol=2e-6, rtol=0)
    assert (out[0] == 0).all()  # length 0: zero output


def test_reference_equals_last_row_of_dense_causal_attention():
    q, k_seq, v_seq, k_pages, v_pages, lengths, table = make_case(1, EDGE_LENGTHS[1:])
    paged = np.asarray(paged_attention(q, k_pages, v_pages, lengths, table, scale=SCALE))
    B, T = len(lengths), P * S
    q_BTHD = np.zeros((B, T, H, D), np.float32)
    q_BTHD[np.arange(B), lengths - 1] = q  # the decode query is the last row of a causal pass
    mask_BTS = causal_mask(jnp.arange(T)[None, :] < lengths[:, None])
    dense = np.asarray(dense_attention(q_BTHD, k_seq, v_seq, mask_BTS, scale=SCALE))
    np.testing.assert_allclose(paged, dense[np.arange(B), lengths - 1], atol=1e-6, rtol=0)


def test_nan_in_unused_pages_and_slots_never_reaches_outputs():
    q, k_seq, v_seq, k_pages, v_pages, lengths, table = make_case(2, EDGE_LENGTHS, fill=np.nan)
    assert np.isnan(k_pages).any() and np.isnan(k_pages[:, table[0, 0]]).all()
    out = np.asarray(paged_attention(q, k_pages, v_pages, lengths, table, scale=SCALE))
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, oracle(q, k_seq, v_seq, lengths, SCALE), atol=2e-6, rtol=0)


def test_physical_page_permutation_leaves_outputs_unchanged():
    q, _, _, k_pages, v_pages, lengths, table = make_case(3, EDGE_LENGTHS)
    perm = np.random.default_rng(4).permutation(N)  # new page i holds old page perm[i]
    inverse = np.argsort(perm)
    out = paged_attention(q, k_pages, v_pages, lengths, table, scale=SCALE)
    permuted = paged_attention(
        q, k_pages[:, perm], v_pages[:, perm], lengths, inverse[table], scale=SCALE
    )
    np.testing.assert_array_equal(np.asarray(out), np.asarray(permuted))


def test_row_depends_only_on_its_own_inputs():
    """At a fixed batch shape a sequence's output is bitwise the same whatever the other rows."""
    q, _, _, k_pages, v_pages, lengths, table = make_case(5, (7, 12, 3, 1))
    fn = jax.jit(paged_attention_reference, static_argnames="scale")
    base = np.asarray(fn(q, k_pages, v_pages, lengths, table, scale=SCALE))
    order = np.array([2, 0, 3, 1])  # same requests, other slots
    moved = np.asarray(fn(q[order], k_pages, v_pages, lengths[order], table[order], scale=SCALE))
    np.testing.assert_array_equal(moved, base[order])
    others = lengths.copy()
    others[1:] = 0  # the other slots empty
    alone = np.asarray(fn(q, k_pages, v_pages, others, table, scale=SCALE))
    np.testing.assert_array_equal(alone[0], base[0])


@given(
    lengths=st.lists(st.integers(0, P * S), min_size=4, max_size=4),
    seed=st.integers(0, 2**31 - 1),
)
def test_reference_matches_oracle_on_random_tables(lengths, seed):
    q, k_seq, v_seq, k_pages, v_pages, lengths, table = make_case(seed, lengths, fill=np.nan)
    out = np.asarray(_jitted_reference(q, k_pages, v_pages, lengths, table))
    np.testing.assert_allclose(out, oracle(q, k_seq, v_seq, lengths, SCALE), atol=2e-6, rtol=0)


_jitted_reference = jax.jit(lambda *a: paged_attention_reference(*a, scale=SCALE))


@pytest.mark.slow
def test_pallas_kernel_in_interpret_mode_matches_reference_without_recompiling():
    # Interpret mode costs seconds per new shape: one shape, two length patterns.
    q, k_seq, v_seq, k_pages, v_pages, lengths, table = make_case(6, EDGE_LENGTHS, fill=np.nan)
    out = np.asarray(
        paged_attention(q, k_pages, v_pages, lengths, table, scale=SCALE, impl="pallas_interpret")
    )
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, oracle(q, k_seq, v_seq, lengths, SCALE), atol=2e-6, rtol=0)
    reference = paged_attention(q, k_pages, v_pages, lengths, table, scale=SCALE)
    np.testing.assert_allclose(out, np.asarray(reference), atol=1e-6, rtol=0)

    from kernels.paged_attention import paged_attention_pallas

    compiled = paged_attention_pallas._cache_size()
    shorter = np.maximum(lengths - 1, 0)
    again = paged_attention(
        q, k_pages, v_pages, shorter, table, scale=SCALE, impl="pallas_interpret"
    )
    assert paged_attention_pallas._cache_size() == compiled
    np.testing.assert_allclose(
        np.asarray(again), oracle(q, k_seq, v_seq, shorter, SCALE), atol=2e-6, rtol=0
    )


def test_bad_arguments_are_named():
    q, _, _, k_pages, v_pages, lengths, table = make_case(7, (1, 2))
    with pytest.raises(ValueError, match="unknown paged attention impl 'triton'"):
        paged_attention(q, k_pages, v_pages, lengths, table, scale=SCALE, impl="triton")
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        paged_attention(q[:, :3], k_pages, v_pages, lengths, table, scale=SCALE)


_jitted_live = jax.jit(lambda *a: paged_attention(*a, scale=SCALE, impl="live"))


def test_live_pages_match_the_oracle_at_edge_lengths_with_nan_in_unused_slots():
    q, k_seq, v_seq, k_pages, v_pages, lengths, table = make_case(8, EDGE_LENGTHS, fill=np.nan)
    out = np.asarray(_jitted_live(q, k_pages, v_pages, lengths, table))
    assert np.isfinite(out).all() and (out[0] == 0).all()
    np.testing.assert_allclose(out, oracle(q, k_seq, v_seq, lengths, SCALE), atol=2e-6, rtol=0)


@given(
    lengths=st.lists(st.integers(0, P * S), min_size=4, max_size=4),
    seed=st.integers(0, 2**31 - 1),
)
def test_live_pages_match_the_oracle_on_random_tables(lengths, seed):
    q, k_seq, v_seq, k_pages, v_pages, lengths, table = make_case(seed, lengths, fill=np.nan)
    out = np.asarray(_jitted_live(q, k_pages, v_pages, lengths, table))
    np.testing.assert_allclose(out, oracle(q, k_seq, v_seq, lengths, SCALE), atol=2e-6, rtol=0)


def test_a_live_row_depends_only_on_its_own_pages_whatever_the_longest_live_sequence():
    """The loop runs over the longest live sequence's pages: a row's bits are the same when a
    neighbour makes it run one, two or three pages, and when its slot moves."""
    q, _, _, k_pages, v_pages, lengths, table = make_case(9, (3, 12, 5, 1))
    base = np.asarray(_jitted_live(q, k_pages, v_pages, lengths, table))
    for longest in (0, 4, 8):  # the second row shorter: the loop stops after 1, 1 or 2 pages
        others = lengths.copy()
        others[1] = longest
        got = np.asarray(_jitted_live(q, k_pages, v_pages, others, table))
        np.testing.assert_array_equal(got[[0, 2, 3]], base[[0, 2, 3]])
    order = np.array([2, 0, 3, 1])
    moved = np.asarray(_jitted_live(q[order], k_pages, v_pages, lengths[order], table[order]))
    np.testing.assert_array_equal(moved, base[order])


def test_live_pages_on_one_page_give_the_reference_bits():
    q, _, _, k_pages, v_pages, lengths, table = make_case(10, (1, 2, 3, S))
    live = np.asarray(_jitted_live(q, k_pages, v_pages, lengths, table[:, :1]))
    reference = np.asarray(_jitted_reference(q, k_pages, v_pages, lengths, table[:, :1]))
    np.testing.assert_array_equal(live, reference)
