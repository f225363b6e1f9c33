"""Parameter-store throughput: put and get of a ~50 MB pytree on file:// and memory://.

Each put hashes and writes a new version of the parameters (no optimizer state), so MB/s is
parameter bytes per second; each get reads the version back and checks every leaf's sha256.
Reports medians over ``--repeats`` runs, and the throughput of ``params_digest`` alone (the
hashing share of both).

A small model's versions: the built-in demo model's parameters and Adam state (~0.6M parameters
in 91 leaves, none over ``PACKED_LEAF_BYTES``), put and then deleted as a run's trainer and
retention do each step, on a file:// store that packs small leaves into one array per tree (the
default) and on one that writes an array per leaf (``pack_below=0``), alternately, ``--repeats``
× 4 times each; ``small_put_speedup`` / ``small_delete_speedup`` are the per-leaf store's median
time over the packed one's. Last line: a JSON object.

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


def small_versions(repeats: int, directory: str | None) -> dict[str, float]:
    """Put + delete of the demo model's versions: packed small leaves against one array each."""
    from runtime.config import Config
    from runtime.model import init_params
    from runtime.session import builtin_config
    from runtime.trainer import StepConfig, make_optimizer

    config = Config()
    model, _ = builtin_config(config)
    params = init_params(model, key=jax.random.key(0))
    opt_state = make_optimizer(StepConfig(model=model, objective=config.objective())).init(params)
    times: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        stores = {"packed": ParamStore.open(f"{tmp}/packed", create=True),
                  "per_leaf": ParamStore.open(f"{tmp}/per_leaf", create=True, pack_below=0)}
        for version in range(4 * repeats + 2):
            for name, store in stores.items():
                tree = jax.tree_util.tree_map(lambda x, v=version: x + v, params)
                start = time.perf_counter()
                store.put(version, tree, opt_state)
                put = time.perf_counter() - start
                if version >= 2:  # two versions kept, as a run keeps them
                    start = time.perf_counter()
                    store.delete(version - 2)
                    took = times.setdefault(name, {"put": [], "delete": []})
                    took["put"].append(put)
                    took["delete"].append(time.perf_counter() - start)
    ms = {name: {op: 1e3 * statistics.median(ts) for op, ts in ops.items()} for name, ops in times.items()}
    return {
        "small_leaves": len(jax.tree_util.tree_leaves((params, opt_state))),
        "small_put_ms": round(ms["packed"]["put"], 2),
        "small_delete_ms": round(ms["packed"]["delete"], 2),
        "small_put_ms_per_leaf_layout": round(ms["per_leaf"]["put"], 2),
        "small_delete_ms_per_leaf_layout": round(ms["per_leaf"]["delete"], 2),
        "small_put_speedup": round(ms["per_leaf"]["put"] / ms["packed"]["put"], 2),
        "small_delete_speedup": round(ms["per_leaf"]["delete"] / ms["packed"]["delete"], 2),
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
    small = small_versions(args.repeats, args.dir)

    print(f"tree: {mb:.1f} MB in {leaves} leaves; params_digest {digest_mb_s} MB/s")
    print(f"file://   put {file_stats['put_mb_s']} MB/s  get {file_stats['get_mb_s']} MB/s")
    print(f"memory:// put {memory_stats['put_mb_s']} MB/s  get {memory_stats['get_mb_s']} MB/s")
    print(f"demo model version: put {small['small_put_ms']} ms, delete {small['small_delete_ms']} ms "
          f"({small['small_put_speedup']}x, {small['small_delete_speedup']}x faster than an array per leaf)")
    result = {
        "tree_mb": round(mb, 1),
        "leaves": leaves,
        "repeats": args.repeats,
        "digest_mb_s": digest_mb_s,
        "file_put_mb_s": file_stats["put_mb_s"],
        "file_get_mb_s": file_stats["get_mb_s"],
        "memory_put_mb_s": memory_stats["put_mb_s"],
        "memory_get_mb_s": memory_stats["get_mb_s"],
        **small,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
