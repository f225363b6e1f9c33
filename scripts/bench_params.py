"""Parameter-store throughput: put and get of a ~50 MB pytree on file:// and memory://.

Each put hashes and writes a new version of the parameters (no optimizer state), so MB/s is
parameter bytes per second; each get reads the version back and checks every leaf's sha256.
Reports medians over ``--repeats`` runs, and the throughput of ``params_digest`` alone (the
hashing share of both). Last line: a JSON object.

    python scripts/bench_params.py [--mb 50] [--repeats 5] [--dir /tmp/somewhere]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.params import ParamStore, params_digest  # noqa: E402


def make_params(total_mb: float, *, d_model: int = 512, seed: int = 0) -> dict:
    """A decoder-shaped tree: float32 embedding and norms, bfloat16 layer matrices."""
    rng = np.random.default_rng(seed)
    vocab = 8192
    tree: dict[str, Any] = {"embed": rng.standard_normal((vocab, d_model), dtype=np.float32)}
    layer_bytes = 12 * d_model * d_model * 2  # qkv+o (4 d²) + mlp (8 d²), bfloat16
    budget = total_mb * 1e6 - tree["embed"].nbytes
    for i in range(max(1, round(budget / layer_bytes))):
        tree[f"layer_{i}"] = {
            "attn": {
                "qkv": rng.standard_normal((d_model, 3 * d_model), dtype=np.float32),
                "out": rng.standard_normal((d_model, d_model), dtype=np.float32),
            },
            "mlp": {
                "up": rng.standard_normal((d_model, 4 * d_model), dtype=np.float32),
                "down": rng.standard_normal((4 * d_model, d_model), dtype=np.float32),
            },
            "norm": np.ones(d_model, np.float32),
        }
        for block in ("attn", "mlp"):
            for name, x in tree[f"layer_{i}"][block].items():
                tree[f"layer_{i}"][block][name] = x.astype(ml_dtypes.bfloat16)
    return tree


def nbytes(tree: dict) -> int:
    return sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(tree))


def measure(url: str, params: dict, repeats: int) -> dict[str, float]:
    store = ParamStore.open(url, create=True)
    mb = nbytes(params) / 1e6
    put_s, get_s = [], []
    for version in range(repeats):
        start = time.perf_counter()
        store.put(version, params)
        put_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        store.get(version)
        get_s.append(time.perf_counter() - start)
    return {
        "put_mb_s": round(mb / statistics.median(put_s), 1),
        "get_mb_s": round(mb / statistics.median(get_s), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=50.0, help="approximate tree size in MB")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", default=None, help="directory for the file:// store")
    args = parser.parse_args()

    params = make_params(args.mb)
    mb = nbytes(params) / 1e6
    leaves = len(jax.tree_util.tree_leaves(params))
    digest_s = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        params_digest(params)
        digest_s.append(time.perf_counter() - start)
    digest_mb_s = round(mb / statistics.median(digest_s), 1)

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        file_stats = measure(f"file://{tmp}/params", params, args.repeats)
    memory_stats = measure("memory://bench-params/", params, args.repeats)

    print(f"tree: {mb:.1f} MB in {leaves} leaves; params_digest {digest_mb_s} MB/s")
    print(f"file://   put {file_stats['put_mb_s']} MB/s  get {file_stats['get_mb_s']} MB/s")
    print(f"memory:// put {memory_stats['put_mb_s']} MB/s  get {memory_stats['get_mb_s']} MB/s")
    result = {
        "tree_mb": round(mb, 1),
        "leaves": leaves,
        "repeats": args.repeats,
        "digest_mb_s": digest_mb_s,
        "file_put_mb_s": file_stats["put_mb_s"],
        "file_get_mb_s": file_stats["get_mb_s"],
        "memory_put_mb_s": memory_stats["put_mb_s"],
        "memory_get_mb_s": memory_stats["get_mb_s"],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
