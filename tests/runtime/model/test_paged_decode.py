"""The paged prefill/decode path against the full forward, and its batch invariance."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from runtime.model import KVCache, Model, ModelConfig, decode, forward, init_cache, prefill
from tests.runtime.inference.conftest import widened_model

CONFIG = ModelConfig(
    vocab_size=53,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=64,
    qkv_bias=True,
    rope_theta=1000.0,
)
# q/k norms and a head_dim other than hidden / heads go through the same layer code.
QWEN3 = CONFIG.replace(architecture="qwen3", qk_norm=True, head_dim=12, qkv_bias=False)
PAGE, PAGES_PER_SEQ, NUM_PAGES = 4, 4, 20  # up to 16 tokens per sequence
# float32 on CPU: the decode path and the full forward differ only in summation order.
DECODE_TOL = 1e-5


def _model(config=CONFIG, seed=0) -> Model:
    return widened_model(seed, config)


def _nan_cache(config=CONFIG) -> KVCache:
    cache = init_cache(config, num_pages=NUM_PAGES, page_size=PAGE)
    return jax.tree_util.tree_map(lambda x: jnp.full_like(x, jnp.nan), cache)


def _tables(num_seqs: int, seed: int) -> np.ndarray:
    """Distinct random physical pages per sequence; page 0 is kept as the null page."""
    perm = 1 + np.random.default_rng(seed).permutation(NUM_PAGES - 1)
    return perm[: num_seqs * PAGES_PER_SEQ].reshape(num_seqs, PAGES_PER_SEQ).astype(np.int32)


@pytest.mark.slow
@pytest.mark.parametrize("config", [CONFIG, QWEN3], ids=["llama_bias", "qwen3_qk_norm_head_dim"])
def test_prefill_then_decode_matches_full_forward(config):
    model = _model(config)
    rng = np.random.default_rng(0)
    total = 13
    seqs = rng.integers(0, config.vocab_size, (3, total)).astype(np.int32)
    prompt_lengths = np.array([5, 1, 8], np.int32)
    full = np.asarray(forward(model.params, seqs, config=config))
    table = _tables(3, seed=1)
    cache = _nan_cache(config)
    bucket = 8
    prompts = np.where(np.arange(bucket) < prompt_lengths[:, None], seqs[:, :bucket], 0)
    logits, cache = prefill(model.params, prompts, prompt_lengths, cache, table, config=config)
    diffs = [np.abs(np.asarray(logits) - full[np.arange(3), prompt_lengths - 1]).max()]
    # Four slots: three sequences fed their own next tokens, one empty slot (position -1);
    # each sequence stops at a different step and its slot then becomes empty.
    slots_table = np.concatenate([table, np.zeros((1, PAGES_PER_SEQ), np.int32)])
    stop = np.array([total, 9, total])
    position = prompt_lengths.copy()
    while (position < stop).any():
        active = position < stop
        tokens = np.append(
            np.where(active, seqs[np.arange(3), np.minimum(position, total - 1)], 0), 0
        )
        positions = np.append(np.where(active, position, -1), -1).astype(np.int32)
        logits, cache = decode(model.params, tokens, positions, cache, slots_table, config=config)
        logits = np.asarray(logits)
        assert np.isfinite(logits).all()
        for b in np.flatnonzero(active):
            diffs.append(np.abs(logits[b] - full[b, position[b]]).max())
        position = np.where(active, position + 1, position)
    print(f"decode vs full forward: max |dlogit| = {max(diffs):.2e} over {len(diffs)} rows")
    assert max(diffs) <= DECODE_TOL
    # Nothing was written outside the three sequences' pages (unused pages keep their NaN).
    used = set(table.ravel().tolist())
    for pages in cache.k_pages + cache.v_pages:
        unused = np.asarray(pages)[:, [p for p in range(NUM_PAGES) if p not in used]]
        assert np.isnan(unused).all()


@pytest.mark.slow
def test_pallas_decode_matches_reference_decode():
    model = _model(seed=3)
    rng = np.random.default_rng(3)
    prompts = rng.integers(0, CONFIG.vocab_size, (2, 8)).astype(np.int32)
    lengths = np.array([8, 6], np.int32)
    table = _tables(2, seed=4)
    _, cache = prefill(model.params, prompts, lengths, _nan_cache(), table, config=CONFIG)
    tokens, positions = np.array([7, 9], np.int32), lengths
    copy = jax.tree_util.tree_map(jnp.copy, cache)
    ref, _ = decode(model.params, tokens, positions, cache, table, config=CONFIG)
    pallas, _ = decode(
        model.params,
        tokens,
        positions,
        copy,
        table,
        config=CONFIG,
        attention_impl="pallas_interpret",
    )
    np.testing.assert_allclose(np.asarray(pallas), np.asarray(ref), atol=1e-5, rtol=0)


def test_a_slot_decodes_the_same_bits_whatever_the_batch_and_slot():
    model = _model(seed=5)
    rng = np.random.default_rng(5)
    prompts = rng.integers(0, CONFIG.vocab_size, (3, 8)).astype(np.int32)
    lengths = np.array([7, 3, 8], np.int32)
    table = _tables(3, seed=6)
    cache = init_cache(CONFIG, num_pages=NUM_PAGES, page_size=PAGE)
    for b in range(3):  # one request per prefill, as the engine does
        _, cache = prefill(
            model.params,
            prompts[b : b + 1],
            lengths[b : b + 1],
            cache,
            table[b : b + 1],
            config=CONFIG,
        )
    snapshot = jax.tree_util.tree_map(np.asarray, cache)
    null = np.zeros(PAGES_PER_SEQ, np.int32)

    def step(order, tokens):
        """Decode with sequence ``order[i]`` in slot ``i`` (-1: empty slot)."""
        rows = [table[o] if o >= 0 else null for o in order]
        positions = [lengths[o] if o >= 0 else -1 for o in order]
        fresh = jax.tree_util.tree_map(jnp.asarray, snapshot)
        logits, new = decode(
            model.params,
            np.asarray(tokens, np.int32),
            np.asarray(positions, np.int32),
            fresh,
            np.stack(rows),
            config=CONFIG,
        )
        return np.asarray(logits), jax.tree_util.tree_map(np.asarray, new)

    full, cache_full = step([0, 1, 2, -1], [11, 12, 13, 0])
    compiled = decode._cache_size()
    moved, cache_moved = step([-1, 2, -1, 0], [0, 40, 0, 11])  # seq 0 in slot 3, other company
    np.testing.assert_array_equal(moved[3], full[0])
    page, slot = table[0, lengths[0] // PAGE], lengths[0] % PAGE
    for a, b in zip(
        cache_full.k_pages + cache_full.v_pages,
        cache_moved.k_pages + cache_moved.v_pages,
        strict=True,
    ):
        np.testing.assert_array_equal(a[:, page, slot], b[:, page, slot])
    assert decode._cache_size() == compiled  # positions and tables are traced, not static


def test_bfloat16_model_runs_all_paths_close_to_float32():
    config32 = CONFIG
    config16 = CONFIG.replace(dtype="bfloat16")
    model = _model(config32, seed=7)
    tokens = np.random.default_rng(7).integers(0, CONFIG.vocab_size, (2, 6)).astype(np.int32)
    full32 = np.asarray(forward(model.params, tokens, config=config32))
    full16 = forward(model.params, tokens, config=config16)
    assert full16.dtype == jnp.float32
    # bf16 keeps 8 mantissa bits: logits of magnitude ~5 move by a few 1e-2 through 2 layers.
    assert np.abs(np.asarray(full16) - full32).max() < 0.25
    cache = init_cache(config16, num_pages=NUM_PAGES, page_size=PAGE)
    assert cache.k_pages[0].dtype == jnp.bfloat16
    table = _tables(2, seed=8)
    lengths = np.array([6, 4], np.int32)
    logits, cache = prefill(model.params, tokens, lengths, cache, table, config=config16)
    logits, cache = decode(model.params, tokens[:, 0], lengths, cache, table, config=config16)
    assert logits.dtype == jnp.float32 and np.isfinite(np.asarray(logits)).all()
    assert cache.bytes_per_page == 2 * 2 * CONFIG.num_kv_heads * PAGE * CONFIG.head_dim * 2
