"""Decode attention throughput over a paged KV cache, and paged vs dense-padded KV memory.

Usage: python scripts/bench_attention.py [--repeats N] [--pallas-interpret]

Throughput: jitted decode attention (one query per sequence, grouped-query heads) of the jnp
reference, of the live-page form (``impl="live"``: page by page over the longest live sequence's
pages) and, for comparison, dense attention over the same keys/values stored contiguously (no
page gather). Lengths are uniform up to the maximum; ``*_short_ms`` times the same batch with every
sequence at most an eighth of the maximum (early in generation), where the reference still reads
every page a sequence could hold and the live form only the live ones: ``live_speedup_short`` is
the reference's time over the live form's there. The Pallas kernel only runs in interpret mode off TPU, which measures the
interpreter, not the kernel; ``--pallas-interpret`` times it at the smallest size anyway.

Memory: a batch of 64 sequences with mixed lengths (uniform in [16, 1024]) cached in pages of
16 tokens vs a dense cache padded to the longest sequence, for a Llama-shaped layer stack.

The last line printed is a JSON object with every figure.
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from kernels.paged_attention import paged_attention

# (batch, num_heads, num_kv_heads, head_dim, page_size, pages_per_seq)
SIZES = [(8, 8, 2, 64, 16, 16), (32, 8, 2, 64, 16, 32), (64, 16, 4, 64, 16, 64)]


def _case(size, seed=0):
    B, H, K, D, S, P = size
    rng = np.random.default_rng(seed)
    N = B * P + 1
    q = jnp.asarray(rng.normal(size=(B, H, D)), jnp.float32)
    k_pages = jnp.asarray(rng.normal(size=(K, N, S, D)), jnp.float32)
    v_pages = jnp.asarray(rng.normal(size=(K, N, S, D)), jnp.float32)
    table = jnp.asarray(1 + rng.permutation(N - 1).reshape(B, P), jnp.int32)
    lengths = jnp.asarray(rng.integers(1, P * S + 1, B), jnp.int32)
    return q, k_pages, v_pages, lengths, table


def _dense_decode(q_BHD, k_BLKD, v_BLKD, lengths_B, *, scale):
    """Same math as the paged reference over contiguous keys/values (no gather)."""
    B, H, D = q_BHD.shape
    K = k_BLKD.shape[2]
    q_BKGD = q_BHD.reshape(B, K, H // K, D)
    s_BKGL = jnp.einsum("bkgd,blkd->bkgl", q_BKGD, k_BLKD) * scale
    valid_B11L = (jnp.arange(k_BLKD.shape[1]) < lengths_B[:, None])[:, None, None, :]
    w_BKGL = jax.nn.softmax(jnp.where(valid_B11L, s_BKGL, -jnp.inf), axis=-1)
    return jnp.einsum("bkgl,blkd->bkgd", w_BKGL, v_BLKD).reshape(B, H, D)


def _time(fn, *args, repeats):
    jax.block_until_ready(fn(*args))  # compile
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - start)
    return best


def bench_throughput(repeats: int, pallas_interpret: bool) -> list[dict]:
    rows = []
    for i, size in enumerate(SIZES):
        B, H, K, D, S, P = size
        q, k_pages, v_pages, lengths, table = _case(size)
        scale = D**-0.5
        ref = jax.jit(functools.partial(paged_attention, scale=scale))
        t_ref = _time(ref, q, k_pages, v_pages, lengths, table, repeats=repeats)
        live = jax.jit(functools.partial(paged_attention, scale=scale, impl="live"))
        t_live = _time(live, q, k_pages, v_pages, lengths, table, repeats=repeats)
        short = jnp.asarray(np.random.default_rng(i).integers(1, P * S // 8 + 1, B), jnp.int32)
        t_ref_short = _time(ref, q, k_pages, v_pages, short, table, repeats=repeats)
        t_live_short = _time(live, q, k_pages, v_pages, short, table, repeats=repeats)
        k_dense = jnp.moveaxis(k_pages[:, table], 0, 3).reshape(B, P * S, K, D)
        v_dense = jnp.moveaxis(v_pages[:, table], 0, 3).reshape(B, P * S, K, D)
        dense = jax.jit(functools.partial(_dense_decode, scale=scale))
        t_dense = _time(dense, q, k_dense, v_dense, lengths, repeats=repeats)
        row = {
            "batch": B,
            "num_heads": H,
            "num_kv_heads": K,
            "head_dim": D,
            "page_size": S,
            "max_len": P * S,
            "mean_len": float(np.mean(np.asarray(lengths))),
            "reference_ms": 1e3 * t_ref,
            "reference_queries_s": B / t_ref,
            "live_ms": 1e3 * t_live,
            "reference_short_ms": 1e3 * t_ref_short,
            "live_short_ms": 1e3 * t_live_short,
            "live_speedup_short": t_ref_short / t_live_short,
            "dense_contiguous_ms": 1e3 * t_dense,
            "dense_contiguous_queries_s": B / t_dense,
        }
        if pallas_interpret and i == 0:
            pallas = jax.jit(
                functools.partial(paged_attention, scale=scale, impl="pallas_interpret")
            )
            t_pallas = _time(pallas, q, k_pages, v_pages, lengths, table, repeats=1)
            row["pallas_interpret_ms"] = 1e3 * t_pallas
        rows.append(row)
        print(json.dumps(row))
    return rows


def bench_memory(seed: int = 0) -> dict:
    """KV bytes for 64 mixed-length sequences: pages of 16 tokens vs dense padded to the max."""
    num_layers, num_kv_heads, head_dim, itemsize, page_size = 24, 2, 64, 2, 16  # bf16 cache
    lengths = np.random.default_rng(seed).integers(16, 1025, 64)
    per_token = 2 * num_layers * num_kv_heads * head_dim * itemsize  # keys and values
    real = int(lengths.sum()) * per_token
    paged = int(np.sum(-(-lengths // page_size))) * page_size * per_token
    dense = len(lengths) * int(lengths.max()) * per_token
    return {
        "sequences": len(lengths),
        "page_size": page_size,
        "real_token_bytes": real,
        "paged_bytes": paged,
        "dense_padded_bytes": dense,
        "paged_over_real": paged / real,
        "dense_over_real": dense / real,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--pallas-interpret", action="store_true")
    args = parser.parse_args()
    throughput = bench_throughput(args.repeats, args.pallas_interpret)
    memory = bench_memory()
    print(json.dumps(memory))
    print(
        json.dumps(
            {
                "backend": jax.default_backend(),
                "throughput": throughput,
                "memory": memory,
            }
        )
    )


if __name__ == "__main__":
    main()
