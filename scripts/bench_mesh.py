#!/usr/bin/env python
"""The demo's train step on a device mesh of 1, 2 and 4 CPU devices (``trainer.mesh={fsdp=N}``),
in one process or as a trainer gang of processes (``workers.trainer_processes``).

A layout ``N`` is one process with N devices (``XLA_FLAGS=--xla_force_host_platform_device_count=N``
must be set before JAX starts); ``PxD`` is a gang of P processes with D devices each, joined with
``jax.distributed`` over loopback (``runtime.trainer.gang``), timed by rank 0; a trailing ``d``
(``4d``, ``2x2d``) sums the gradient in a fixed order (``trainer.deterministic_reduction``), whose
cost is the ratio of ``4d`` to ``4``. Each runs the demo's model and a demo-shaped batch (32 prompts of 9 tokens ×
8 completions of up to 5), parameters and Adam's moments placed by ``runtime.trainer.mesh``'s rules,
the batch split by rows; two warm-up steps, then ``--steps`` timed steps, each blocked on its
result. Reported per layout: the median seconds a step and their range over ``--repeats``
runs, and the ratio to the first layout measured in the same invocation. Host devices share the
machine's cores, so on a small machine more devices are not faster: this measures what the mesh
costs, not what it buys on real accelerators.

Usage: python scripts/bench_mesh.py [--layouts 1 2 4 2x1 2d 4d] [--steps 20] [--repeats 3]
The last line of output is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

CHILD = """
import dataclasses, json, sys, time
devices, steps, processes, rank, port, fixed = (int(a) for a in sys.argv[1:7])
if processes > 1:
    from runtime.trainer.gang import Gang, GangSpec
    Gang.join(GangSpec(rank, processes, f"127.0.0.1:{port}"))
import jax, jax.numpy as jnp, numpy as np
from runtime.config import MeshShape, load_config
from runtime.session import builtin_config, step_config
from runtime.model import init_params
from runtime.trainer import Sample, make_optimizer, pack, train_step
from runtime.trainer.batch import shared_prefix
from runtime.trainer.mesh import make_mesh, shard_rows, shard_tree

config = load_config(None, [])
model, _ = builtin_config(config)
mesh = make_mesh(MeshShape(fsdp=jax.device_count()))
rng = np.random.default_rng(0)
samples = []
for m in range(32):
    prompt = np.int32([1] + list(rng.integers(3, 20, 8)))
    for g in range(8):
        n = int(rng.integers(2, 6))
        samples.append(Sample(prompt, np.int32(list(rng.integers(3, 20, n - 1)) + [2]),
                              np.float32(-np.ones(n)), float(rng.integers(0, 2)), 0))
sc = step_config(config.resolved(), type("M", (), {"config": model})())
sc = dataclasses.replace(sc, prefix=shared_prefix(samples, 8), fixed_order_mesh=mesh if fixed else None)
batch = pack(samples, group_size=8, width=14, pad_id=0)
params = shard_tree(mesh, init_params(model, key=jax.random.key(0)))
opt = make_optimizer(sc).init(params)
b, z, c = shard_rows(mesh, (batch, np.zeros(batch.mask_BS.shape, np.float32), np.ones((256,), bool)))
times = []
for i in range(2 + steps):
    t = time.perf_counter()
    params, opt, metrics = train_step(params, opt, b, z, z, c, config=sc)
    params, opt = shard_tree(mesh, params), shard_tree(mesh, opt)
    jax.block_until_ready(params)
    if i >= 2:
        times.append(time.perf_counter() - t)
print(json.dumps({"devices": jax.device_count(), "step_s": sorted(times)[len(times) // 2],
                  "loss": float(metrics["loss"])}), flush=True)
if processes > 1:
    jax.distributed.shutdown()
"""


def parse_layout(text: str) -> tuple[int, int, bool]:
    """``N`` → (1 process, N devices, False); ``PxD`` → (P processes, D devices each, False); a
    trailing ``d``: the fixed-order reduction (True)."""
    fixed = text.endswith("d")
    body = text.removesuffix("d")
    processes, sep, devices = body.partition("x")
    if not sep:
        processes, devices = "1", body
    if not (processes.isdigit() and devices.isdigit()) or not 1 <= int(processes) * int(devices) <= 64 \
            or int(processes) < 1 or int(devices) < 1:
        raise ValueError(f"layout {text!r}: write N (devices of one process) or PxD (P processes × D devices), "
                         "at most 64 devices, with a trailing d for the fixed-order reduction")
    return int(processes), int(devices), fixed


def measure(layout: str, steps: int) -> dict:
    processes, devices, fixed = parse_layout(layout)
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with socket.socket() as sock:  # a free loopback port for the gang's coordinator
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(devices), str(steps), str(processes), str(rank),
                               str(port), str(int(fixed))], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(processes)]
    outs = [proc.communicate() for proc in procs]
    for proc, (_, stderr) in zip(procs, outs, strict=True):
        if proc.returncode != 0:
            tail = " | ".join(stderr.strip().splitlines()[-3:])
            raise SystemExit(f"bench_mesh: layout {layout} failed: {tail}")
    return json.loads(outs[0][0].strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layouts", nargs="+", default=["1", "2", "4", "2x1", "2d", "4d"],
                   help="N: one process with N devices; PxD: a gang of P processes × D devices; a trailing d: "
                        "the fixed-order reduction (default 1 2 4 2x1 2d 4d)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per process (default 20)")
    p.add_argument("--repeats", type=int, default=3, help="processes per device count (default 3)")
    args = p.parse_args(argv)
    for name in ("steps", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name} {getattr(args, name)}: it must be >= 1")
    for layout in args.layouts:
        try:
            parse_layout(layout)
        except ValueError as e:
            p.error(f"--layouts: {e}")
    runs: dict[str, list[float]] = {layout: [] for layout in args.layouts}
    started = time.perf_counter()
    for _ in range(args.repeats):  # layouts interleaved, so a slow spell hits all of them
        for layout in args.layouts:
            got = measure(layout, args.steps)
            runs[layout].append(got["step_s"])
            print(f"layout {layout} ({got['devices']} devices): {got['step_s'] * 1000:.1f} ms a step",
                  file=sys.stderr, flush=True)
    base = statistics.median(runs[args.layouts[0]])
    result = {
        "mesh": "fsdp",
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "steps": args.steps,
        "repeats": args.repeats,
        "step_s": {layout: statistics.median(v) for layout, v in runs.items()},
        "step_s_range": {layout: [min(v), max(v)] for layout, v in runs.items()},
        f"ratio_to_{args.layouts[0]}": {layout: statistics.median(v) / base for layout, v in runs.items()},
        "seconds": time.perf_counter() - started,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
