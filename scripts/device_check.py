#!/usr/bin/env python
"""One check of rlx on this machine's accelerator (or its CPU), in a few minutes, as one JSON line.

1. **Demo**: the built-in demo (``rlx run`` with the default config, the roles as worker
   processes) for ``--steps`` RL steps, evaluated on the held-out sums at version 0 and at the
   last version only, into ``WORK/demo-1``. From its ``summary.json``: ``demo_steps_per_min`` (over
   the RL time) and ``demo_gain_pts``, the greedy held-out pass rate of the last version less
   version 0's, in points.
2. **Determinism**: the same run again into ``WORK/demo-2``; ``digest_match``: both end on the
   same final digest. ``rlx replay WORK/demo-1 --json`` re-derives every version of the first;
   ``replay_exact``: it reports bit-exact.
3. **Layout**: which devices each role of the first run used, from its ledger: ``RunStarted``'s
   ``fingerprint["layout"]`` (role → device ids) where the run recorded one, else each
   ``WorkerJoined``'s ``info["placement"]["devices"]`` by worker, else ``{"all": ids}`` of this
   process's local devices (``layout_source`` says which).
4. **Engine vs Hugging Face**: ``scripts/bench_inference.py``'s ``small`` model and log-uniform
   workload through the rlx engine (continuous batching) and through Transformers' greedy
   ``generate`` on the same weights (on CUDA where torch sees a GPU; on the CPU with 1 thread or
   every core, whichever is faster); ``engine_vs_hf`` is the engine's generated tokens/s over
   HF's, best of ``repeats`` each.
5. **Train step**: ``scripts/bench_trainer.py``'s Qwen2.5-0.5B-shaped GRPO step (bfloat16
   compute, float32 master weights and Adam state, micro-batches of 4 rows, log-probs in chunks
   of 32 positions, remat), compiled and run: ``step_s_05b`` is the median of the timed steps
   after the warm-up ones, ``peak_gib_05b`` the peak memory. On a GPU or TPU that is the device's
   ``peak_bytes_in_use`` (this process takes memory as it needs it, and trains before the engine
   part runs); on the CPU, which keeps no such count, XLA's accounting of the compiled step
   (arguments + outputs − aliased + temporaries), which ``compiled_gib_05b`` reports everywhere.
   ``peak_source_05b`` says which. With ``--small`` the shape is reduced (``shape_05b``).

``--small`` (which ``scripts/device_check`` passes where JAX's backend is the CPU) shrinks every
part: 20 demo steps, 16 requests on 8 slots, a 2-layer step of 8 rows × 64 tokens over a 16,384
token vocabulary. A part that fails leaves its keys ``null`` and its one-line error in
``errors``; the others still run. The exit status is 0 when no part failed and both determinism
checks hold (``ok``).

Usage: python scripts/device_check.py [--small] [--out DIR] [--steps N]
Progress goes to stderr; the last line of stdout is a JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (REPO, os.path.join(REPO, "scripts")):
    if path not in sys.path:
        sys.path.insert(0, path)

# The runs' workers get the environment this script was given (each its own share of a GPU);
# this process shares the accelerator with them and with torch, so it takes memory as it needs
# it, and the train step's peak is the step's own.
CHILD_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)}
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import chaos  # noqa: E402  (scripts/chaos.py: a run's process group and log)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from runtime.service.supervisor import rlx_command  # noqa: E402

GIB = 1 << 30
PAGE_SIZE = 8  # the engine's KV page, as bench_inference.py's default
STEP_MEMORY: dict[str, Any] = {"micro_batch_size": 4, "logits_chunk": 32, "remat": True}  # bench_trainer.py's memory settings
REQUIRED = ("backend", "devices", "layout", "demo_steps_per_min", "demo_gain_pts", "digest_match", "replay_exact",
            "engine_vs_hf", "step_s_05b", "peak_gib_05b")


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How much each part does: demo RL steps and the seconds after which an ``rlx`` command is
    taken for a hang; engine requests, slots and timed repeats; the 0.5B step's shape overrides
    (none: the full shape), rows, tokens per row, warm-up and timed steps."""

    demo_steps: int
    timeout_s: float
    requests: int
    slots: int
    repeats: int
    shape: dict
    rows: int
    width: int
    warmup: int
    timed: int


FULL = Sizes(demo_steps=150, timeout_s=300.0, requests=64, slots=16, repeats=2, shape={}, rows=32, width=1024,
             warmup=2, timed=3)
SMALL = Sizes(demo_steps=20, timeout_s=600.0, requests=16, slots=8, repeats=1,
              shape={"num_layers": 2, "vocab_size": 16384}, rows=8, width=64, warmup=1, timed=3)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def load_script(name: str):
    """``scripts/NAME.py`` imported as a module (the benchmarks are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "scripts", f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# --- 1-3: the demo, its twin, its replay and its layout -----------------------------------------

def rlx(args: list[str], log_path: str, timeout_s: float) -> tuple[int, str]:
    """(exit status, stdout) of ``rlx ARGS`` in its own process group (killed whole after
    ``timeout_s``: a hang); ``log_path`` gets its stderr, then its stdout."""
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen([*rlx_command(), *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=log_file, env=CHILD_ENV, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            chaos.kill_group(proc)
            raise RuntimeError(f"rlx {args[0]} did not finish in {timeout_s:.0f} s; see {log_path}") from None
        log_file.write(out)
    return proc.returncode, out.decode(errors="replace")


def demo_run(out: str, sizes: Sizes) -> dict:
    """The demo for ``demo_steps`` steps into ``out`` (evaluated at its first and last version); its summary."""
    steps = sizes.demo_steps
    code, _ = rlx(["run", "--out", out, "--no-progress", "--set", f"run.steps={steps}",
                   "--set", f"eval.every_steps={steps}"], out + ".log", sizes.timeout_s)
    if code != 0:
        raise RuntimeError(f"rlx run exited with {code}: {chaos.log_tail(out + '.log', 2)}")
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        return json.load(f)


def replay(out: str, sizes: Sizes) -> dict:
    """``rlx replay OUT --json``'s report (it exits 1 on a divergence, which the report shows)."""
    code, stdout = rlx(["replay", out, "--json"], out + ".replay.log", sizes.timeout_s)
    lines = stdout.strip().splitlines()
    if code not in (0, 1) or not lines:
        raise RuntimeError(f"rlx replay exited with {code}: {chaos.log_tail(out + '.replay.log', 2)}")
    return json.loads(lines[-1])


def run_layout(out: str) -> tuple[dict, str]:
    """(role or worker → device ids, where that came from) for the run in ``out``."""
    from ledger import events as ev
    from ledger import open_store
    from runtime.rundir import RunDir, run_started

    with open_store(out, readonly=True) as store:
        run_id = RunDir(out).select_run(store)
        layout = run_started(store, run_id).fingerprint.get("layout")
        if layout:
            return layout, "RunStarted"
        placed = {
            s.event.worker_id: s.event.info["placement"].get("devices")
            for s in store.read(run_id)
            if isinstance(s.event, ev.WorkerJoined) and isinstance(s.event.info.get("placement"), dict)
        }
    if placed:
        return placed, "WorkerJoined"
    return {"all": [d.id for d in jax.local_devices()]}, "local devices"


# --- 4: the engine against Hugging Face generate ------------------------------------------------

def engine_vs_hf(sizes: Sizes) -> dict:
    """Generated tokens/s of the rlx engine and of HF ``generate`` on the same weights and requests."""
    import torch
    import transformers  # noqa: F401 - load_hf_model gives None without it; this says why

    from runtime.inference import Engine
    from runtime.model import Model

    bench = load_script("bench_inference")
    config = bench.MODELS["small"]
    model = Model.init(config, key=jax.random.key(0))
    prompts, params = bench.workload(sizes.requests, 0, config.vocab_size, "loguniform")
    seeds = list(range(sizes.requests))
    engine = Engine(model, max_slots=sizes.slots, page_size=PAGE_SIZE,
                    num_pages=1 + sizes.slots * -(-bench.MAX_SEQ_LEN // PAGE_SIZE), max_seq_len=bench.MAX_SEQ_LEN)
    engine.generate(prompts[:2], params[:2], seeds[:2])  # compiles
    hf = bench.load_hf_model(model)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    hf = hf.to(device)
    # On the CPU torch's thread pool can be slower with every core than with one (bench_inference.py).
    threads: list[int | None] = [None] if device == "cuda" else [*sorted({1, os.cpu_count() or 1})]
    engine_s, hf_s, mismatched = [], [], []
    for _ in range(sizes.repeats):
        seconds, completions, stats = bench.time_engine(engine, prompts, params, seeds, "continuous")
        engine_s.append(seconds)
        for n in threads:
            if n is not None:
                torch.set_num_threads(n)
            with torch.device(device):  # hf_generate's input tensors are made on the model's device
                seconds, hf_tokens, mismatched = bench.hf_generate(hf, prompts, params, sizes.slots, completions)
            hf_s.append(seconds)
    engine_tok_s = stats.generated_tokens / min(engine_s)
    hf_tok_s = hf_tokens / min(hf_s)
    return {"engine_vs_hf": round(engine_tok_s / hf_tok_s, 3), "engine_tok_s": round(engine_tok_s, 1),
            "hf_tok_s": round(hf_tok_s, 1), "hf_device": device, "hf_mismatched_requests": len(mismatched),
            "engine_requests": sizes.requests, "engine_slots": sizes.slots}


# --- 5: the Qwen2.5-0.5B-shaped train step ------------------------------------------------------

def step_05b(sizes: Sizes) -> dict:
    """The 0.5B-shaped step compiled, run ``warmup`` times, then timed ``timed`` times."""
    from kernels.algorithms import configure
    from runtime.model import init_params
    from runtime.trainer import StepConfig, make_optimizer, train_step

    bench = load_script("bench_trainer")
    model = dataclasses.replace(bench.QWEN25_05B, **sizes.shape)
    config = StepConfig(model=model, objective=configure("grpo"), **STEP_MEMORY)
    params = jax.jit(lambda key: init_params(model, key=key))(jax.random.key(0))
    opt_state = make_optimizer(config).init(params)
    batch = jax.device_put(bench.random_batch(sizes.rows, sizes.width, model.vocab_size, seed=0))
    logp_BS = jnp.zeros((sizes.rows, sizes.width - 1), jnp.float32)
    current_B = jnp.ones((sizes.rows,), bool)
    start = time.perf_counter()
    compiled = train_step.lower(params, opt_state, batch, logp_BS, logp_BS, current_B, config=config).compile()
    compile_s = time.perf_counter() - start
    analysis = compiled.memory_analysis()
    compiled_bytes = None if analysis is None else (
        analysis.argument_size_in_bytes + analysis.output_size_in_bytes - analysis.alias_size_in_bytes
        + analysis.temp_size_in_bytes)
    times = []
    for i in range(sizes.warmup + sizes.timed):
        start = time.perf_counter()
        params, opt_state, metrics = compiled(params, opt_state, batch, logp_BS, logp_BS, current_B)
        jax.block_until_ready((params, metrics))
        if i >= sizes.warmup:
            times.append(time.perf_counter() - start)
    peak = (jax.local_devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
    source = "peak_bytes_in_use" if peak is not None else "xla memory analysis"
    peak = peak if peak is not None else compiled_bytes
    if peak is None:
        raise RuntimeError("this backend reports neither its peak memory nor the step's memory analysis")
    return {
        "step_s_05b": round(statistics.median(times), 4),
        "peak_gib_05b": round(peak / GIB, 3),
        "peak_source_05b": source,
        "compiled_gib_05b": None if compiled_bytes is None else round(compiled_bytes / GIB, 3),
        "compile_s_05b": round(compile_s, 1),
        "step_times_05b": [round(t, 4) for t in times],
        "shape_05b": {"num_layers": model.num_layers, "hidden_size": model.hidden_size,
                      "vocab_size": model.vocab_size, "rows": sizes.rows, "width": sizes.width,
                      "num_params": sum(x.size for x in jax.tree.leaves(params)), **STEP_MEMORY},
        "grad_norm_05b": float(metrics["grad_norm"]),
    }


# --- the check ----------------------------------------------------------------------------------

def attempt(errors: dict[str, str], part: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or None with ``errors[part]`` set to its one-line error (traceback on stderr)."""
    log(f"{part}: ...")
    start = time.monotonic()
    try:
        value = fn(*args)
    except Exception as e:  # a part's failure is the check's finding, never the end of the check
        traceback.print_exc(file=sys.stderr)
        errors[part] = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
        value = None
    log(f"{part}: {'failed' if part in errors else 'done'} in {time.monotonic() - start:.0f} s")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="small sizes (the CPU's)")
    parser.add_argument("--out", default=None, help="where the runs go (default: a new temporary directory)")
    parser.add_argument("--steps", type=int, default=None, help="demo RL steps (default: 150, 20 with --small)")
    args = parser.parse_args(argv)
    sizes = SMALL if args.small else FULL
    if args.steps is not None:
        sizes = dataclasses.replace(sizes, demo_steps=args.steps)
    if args.out is not None:
        os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="rlx-device-check-", dir=args.out)
    started = time.monotonic()
    devices = jax.local_devices()
    result: dict[str, Any] = dict.fromkeys(REQUIRED)
    result.update(backend=jax.default_backend(), devices=len(devices), device_kind=devices[0].device_kind,
                  small=args.small, demo_steps=sizes.demo_steps, work=work, cpu=platform.processor() or platform.machine(),
                  cores=os.cpu_count(), jax=jax.__version__)
    log(f"device check: {len(devices)} {result['backend']} device(s) ({result['device_kind']}), runs in {work}")
    errors: dict[str, str] = {}

    first = attempt(errors, "demo", demo_run, os.path.join(work, "demo-1"), sizes)
    if first is not None:
        result.update(demo_steps_per_min=round(first["steps_per_minute"], 2),
                      demo_gain_pts=round(100.0 * (first["eval_after"] - first["eval_before"]), 2),
                      demo_eval_before=first["eval_before"], demo_eval_after=first["eval_after"],
                      demo_rl_s=round(first["rl_seconds"], 1), digest_1=first["final_digest"])
    second = attempt(errors, "demo twin", demo_run, os.path.join(work, "demo-2"), sizes)
    if second is not None:
        result["digest_2"] = second["final_digest"]
        if first is not None:
            result["digest_match"] = first["final_digest"] == second["final_digest"]
    if first is not None:
        report = attempt(errors, "replay", replay, os.path.join(work, "demo-1"), sizes)
        if report is not None:
            result.update(replay_exact=bool(report["match"]), replay_s=round(report["seconds"], 1),
                          replay_versions=report["versions_verified"], replay_divergences=report["divergence_count"])
        found = attempt(errors, "layout", run_layout, os.path.join(work, "demo-1"))
        if found is not None:
            result["layout"], result["layout_source"] = found
    result.update(attempt(errors, "train step", step_05b, sizes) or {})
    result.update(attempt(errors, "engine vs hf", engine_vs_hf, sizes) or {})

    result["errors"] = errors
    result["ok"] = not errors and result["digest_match"] is True and result["replay_exact"] is True
    result["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
