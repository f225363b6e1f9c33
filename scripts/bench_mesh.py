#!/usr/bin/env python
"""The demo's train step on a device mesh of 1, 2 and 4 CPU devices (``trainer.mesh={fsdp=N}``).

Each device count runs in its own process (``XLA_FLAGS=--xla_force_host_platform_device_count=N``
must be set before JAX starts): the demo's model and a demo-shaped batch (32 prompts of 9 tokens ×
8 completions of up to 5), parameters and Adam's moments placed by ``runtime.trainer.mesh``'s rules,
the batch split by rows; two warm-up steps, then ``--steps`` timed steps, each blocked on its
result. Reported per device count: the median seconds a step and their range over ``--repeats``
processes, and the ratio to one device measured in the same invocation. Host devices share the
machine's cores, so on a small machine more devices are not faster: this measures what the mesh
costs, not what it buys on real accelerators.

Usage: python scripts/bench_mesh.py [--devices 1 2 4] [--steps 20] [--repeats 3]
The last line of output is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

CHILD = """
import dataclasses, json, sys, time
import jax, jax.numpy as jnp, numpy as np
from runtime.config import MeshShape, load_config
from runtime.session import _builtin_config, step_config
from runtime.model import init_params
from runtime.trainer import Sample, make_optimizer, pack, train_step
from runtime.trainer.batch import shared_prefix
from runtime.trainer.mesh import make_mesh, shard_rows, shard_tree

devices, steps = int(sys.argv[1]), int(sys.argv[2])
config = load_config(None, [])
model, _ = _builtin_config(config)
mesh = make_mesh(MeshShape(fsdp=devices))
rng = np.random.default_rng(0)
samples = []
for m in range(32):
    prompt = np.int32([1] + list(rng.integers(3, 20, 8)))
    for g in range(8):
        n = int(rng.integers(2, 6))
        samples.append(Sample(prompt, np.int32(list(rng.integers(3, 20, n - 1)) + [2]),
                              np.float32(-np.ones(n)), float(rng.integers(0, 2)), 0))
sc = step_config(config.resolved(), type("M", (), {"config": model})())
sc = dataclasses.replace(sc, prefix=shared_prefix(samples, 8))
batch = pack(samples, group_size=8, width=14, pad_id=0)
params = shard_tree(mesh, init_params(model, key=jax.random.key(0)))
opt = make_optimizer(sc).init(params)
zeros = jnp.zeros(batch.mask_BS.shape, jnp.float32)
b, z, c = shard_rows(mesh, (jax.device_put(batch), zeros, jnp.ones((256,), bool)))
times = []
for i in range(2 + steps):
    t = time.perf_counter()
    params, opt, metrics = train_step(params, opt, b, z, z, c, config=sc)
    params, opt = shard_tree(mesh, params), shard_tree(mesh, opt)
    jax.block_until_ready(params)
    if i >= 2:
        times.append(time.perf_counter() - t)
print(json.dumps({"devices": jax.device_count(), "step_s": sorted(times)[len(times) // 2],
                  "loss": float(metrics["loss"])}))
"""


def measure(devices: int, steps: int) -> dict:
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(devices), str(steps)], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise SystemExit(f"bench_mesh: {devices} devices failed: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4], help="device counts (default 1 2 4)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per process (default 20)")
    p.add_argument("--repeats", type=int, default=3, help="processes per device count (default 3)")
    args = p.parse_args(argv)
    for name in ("steps", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name} {getattr(args, name)}: it must be >= 1")
    if any(d < 1 or d > 64 for d in args.devices):
        p.error(f"--devices {args.devices}: each must be between 1 and 64")
    runs: dict[int, list[float]] = {d: [] for d in args.devices}
    started = time.perf_counter()
    for _ in range(args.repeats):  # device counts interleaved, so a slow spell hits all of them
        for d in args.devices:
            got = measure(d, args.steps)
            runs[d].append(got["step_s"])
            print(f"{d} device(s): {got['step_s'] * 1000:.1f} ms a step", file=sys.stderr, flush=True)
    base = statistics.median(runs[args.devices[0]])
    result = {
        "mesh": "fsdp",
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "steps": args.steps,
        "repeats": args.repeats,
        "step_s": {str(d): statistics.median(v) for d, v in runs.items()},
        "step_s_range": {str(d): [min(v), max(v)] for d, v in runs.items()},
        f"ratio_to_{args.devices[0]}": {str(d): statistics.median(v) / base for d, v in runs.items()},
        "seconds": time.perf_counter() - started,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
