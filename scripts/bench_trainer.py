"""Train step memory and throughput: a Qwen2.5-0.5B-shaped step's memory, the demo's step speed.

Usage: python scripts/bench_trainer.py [--rows 256 32] [--width 1024] [--micro-batch 4]
                                       [--logits-chunk 32] [--repeats 9] [--warmup 3] [--baseline-ref REV]
                                       [--no-memory] [--no-speed] [--no-packing] [--mesh-devices 2]
                                       [--mesh-run-rows 8]

Memory: a decoder of Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 query heads, 2 kv heads,
SwiGLU 4864, vocabulary 151,936, tied embeddings, q/k/v biases; random weights that are never
materialised) and its GRPO train step at ``--width`` tokens per row, bfloat16 compute with float32
master weights and Adam state, micro-batches of ``--micro-batch`` rows, log-probs in chunks of
``--logits-chunk`` positions and rematerialised layers. The step is only lowered and compiled,
never run: the figure is XLA's own accounting of the compiled program's temporary buffers
(``compiled.memory_analysis().temp_size_in_bytes``), which excludes the arguments (parameters,
optimizer state, batch) and the outputs that alias them. It is measured at every ``--rows``
count; ``temp_ratio_256_vs_32`` is the first count's over the last's. For scale,
``plain_logits_gib`` is the float32 ``[rows, width, vocab]`` logits alone that the plain step
holds at the first count.

Speed: the built-in demo's model (the default ``model`` section, character vocabulary) and its
default batch (``scheduling.groups_per_batch`` × ``sampling.group_size`` rows, 32 tokens wide), with
the default trainer settings, through this tree's ``train_step`` and through the step as it was
at ``--baseline-ref`` (its ``runtime/trainer/step.py`` read from git and imported beside this one;
by default ``7e492d8``, the last revision before the step gained micro-batches, chunks, remat and
bfloat16).
Both are compiled and run ``--warmup`` times untimed first (the first calls of a step on this
machine are slower, while its buffers are first touched), then timed alternately ``--repeats``
times each, each round starting with the next one; the figures are the medians, and
``step_over_baseline`` is the median over rounds of the round's baseline time over its step time
(a ratio within a round, so that a drift of the machine's speed cancels). ``step_tok_s`` /
``baseline_tok_s`` count every position of every row (B × T) per second.
``same_program_as_baseline`` says whether the two compile to the same optimized XLA program (its
instructions, without source locations): where they do, any difference in their times is the
machine's noise. ``bounded_tok_s`` is the same step with micro-batches of 32 rows, chunks of 8 positions
and remat (the memory settings on a model too small to need them: their cost in compute).

Packing: one batch of 32 rows of log-normal lengths (prompts of 32–128 tokens, completions of median
64 and at most 512) through the padded step and the packed one (``trainer.pack``) on a small decoder
(4 layers of width 256): ``packed_over_padded`` is the median over alternated rounds of the padded
step's time over the packed one's (the same real tokens each).

Sharded and bounded: the same 0.5B-shaped step with ``trainer.mesh={fsdp=N}`` (``--mesh-devices``,
default 2, CPU devices of a child process) and the memory settings above together: XLA's per-device
temporaries of the compiled step at the first ``--rows`` count (``mesh_bounded_temp_gib``), and one
step executed on random weights at ``--mesh-run-rows`` rows (``mesh_bounded_executed``: it ran and
gave a finite, non-zero gradient norm; ``mesh_executed_s``).

The last line printed is a JSON object with every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels.algorithms import configure  # noqa: E402
from runtime.config import Config, load_config  # noqa: E402
from runtime.model import ModelConfig, init_params  # noqa: E402
from runtime.trainer import StepConfig, TrainBatch, make_optimizer, train_step  # noqa: E402

GIB = 1 << 30
QWEN25_05B = ModelConfig(
    vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
    intermediate_size=4864, tie_word_embeddings=True, qkv_bias=True, architecture="qwen2",
    rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=32768,
    dtype="bfloat16", param_dtype="float32",
)
GROUP_SIZE = 8
DEMO_WIDTH = 32
DEMO_COMPLETION = 8


def batch_shapes(rows: int, width: int):
    """The shapes of a ``rows`` × ``width`` batch (a ``TrainBatch`` of ``ShapeDtypeStruct``)."""
    S = width - 1
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), TrainBatch(
        tokens_BT=np.zeros((rows, width), np.int32),
        attention_BT=np.zeros((rows, width), bool),
        mask_BS=np.zeros((rows, S), bool),
        behaviour_BS=np.zeros((rows, S), np.float32),
        rewards_MG=np.zeros((rows // GROUP_SIZE, GROUP_SIZE), np.float32),
        versions_B=np.zeros(rows, np.int32),
    ))


def random_batch(rows: int, width: int, vocab_size: int, *, seed: int) -> TrainBatch:
    """A ``rows`` × ``width`` batch of random tokens, every position attended, the second half of
    each row a completion (behaviour log-prob -2) with 0/1 rewards: a step to execute, not to learn from."""
    gen = np.random.default_rng(seed)
    mask_BS = np.zeros((rows, width - 1), bool)
    mask_BS[:, width // 2:] = True
    return TrainBatch(tokens_BT=gen.integers(4, vocab_size, (rows, width)).astype(np.int32),
                      attention_BT=np.ones((rows, width), bool), mask_BS=mask_BS,
                      behaviour_BS=np.where(mask_BS, -2.0, 0.0).astype(np.float32),
                      rewards_MG=gen.integers(0, 2, (rows // GROUP_SIZE, GROUP_SIZE)).astype(np.float32),
                      versions_B=np.zeros(rows, np.int32))


def step_memory(model: ModelConfig, rows: int, width: int, **memory) -> dict:
    """XLA's memory accounting of the compiled train step (nothing is allocated or run)."""
    config = StepConfig(model=model, objective=configure("grpo"), **memory)
    params = jax.eval_shape(lambda: init_params(model, key=jax.random.key(0)))
    opt_state = jax.eval_shape(make_optimizer(config).init, params)
    f32_BS = jax.ShapeDtypeStruct((rows, width - 1), jnp.float32)
    start = time.perf_counter()
    compiled = train_step.lower(
        params, opt_state, batch_shapes(rows, width), f32_BS, f32_BS,
        jax.ShapeDtypeStruct((rows,), jnp.bool_), config=config,
    ).compile()
    seconds = time.perf_counter() - start
    analysis = compiled.memory_analysis()
    assert analysis is not None, "this backend reports no memory analysis"
    return {
        "rows": rows,
        "temp_gib": analysis.temp_size_in_bytes / GIB,
        "argument_gib": analysis.argument_size_in_bytes / GIB,
        "output_gib": analysis.output_size_in_bytes / GIB,
        "alias_gib": analysis.alias_size_in_bytes / GIB,
        "compile_s": seconds,
    }


def mesh_bounded(rows: int, width: int, run_rows: int, **memory) -> dict:
    """The 0.5B-shaped step sharded over this process's devices (``trainer.mesh={fsdp=N}``) and
    bounded (micro-batches, chunks, remat) together: XLA's per-device temporaries of the compiled
    step at ``rows`` × ``width`` (nothing allocated), then one step executed at ``run_rows`` rows
    on random weights, to show it runs."""
    from jax.sharding import NamedSharding, PartitionSpec

    from runtime.config import MeshShape
    from runtime.trainer.mesh import make_mesh, param_spec, shard_rows

    devices = jax.device_count()
    mesh = make_mesh(MeshShape(fsdp=devices))
    assert mesh is not None, "the mesh needs more than one device"
    config = StepConfig(model=QWEN25_05B, objective=configure("grpo"), row_shards=devices, **memory)

    def sharded(tree):
        return jax.tree_util.tree_map_with_path(
            lambda path, x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                 sharding=NamedSharding(mesh, param_spec(mesh, path, x.shape))), tree)

    def by_rows(tree):
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(
            mesh, PartitionSpec(("data", "fsdp")) if x.shape and x.shape[0] % devices == 0 else PartitionSpec())),
            tree)

    params = sharded(jax.eval_shape(lambda: init_params(QWEN25_05B, key=jax.random.key(0))))
    opt_state = sharded(jax.eval_shape(make_optimizer(config).init, params))

    def compile_for(n: int):
        f32_BS = jax.ShapeDtypeStruct((n, width - 1), jnp.float32)
        args = by_rows((batch_shapes(n, width), f32_BS, f32_BS, jax.ShapeDtypeStruct((n,), jnp.bool_)))
        return train_step.lower(params, opt_state, *args, config=config).compile()

    start = time.perf_counter()
    analysis = compile_for(rows).memory_analysis()
    compile_s = time.perf_counter() - start
    assert analysis is not None, "this backend reports no memory analysis"
    step = compile_for(run_rows)
    shardings = jax.tree.map(lambda x: x.sharding, (params, opt_state))
    p = jax.jit(lambda key: init_params(QWEN25_05B, key=key), out_shardings=shardings[0])(jax.random.key(0))
    o = jax.jit(make_optimizer(config).init, out_shardings=shardings[1])(p)
    batch = random_batch(run_rows, width, QWEN25_05B.vocab_size, seed=0)
    zeros = np.zeros((run_rows, width - 1), np.float32)
    args = shard_rows(mesh, (batch, zeros, zeros, np.ones(run_rows, bool)))
    start = time.perf_counter()
    _, _, metrics = step(p, o, *args)
    grad_norm = float(metrics["grad_norm"])
    return {
        "mesh_devices": devices, "mesh_rows": rows, "mesh_width": width, "mesh_settings": memory,
        "mesh_bounded_temp_gib": analysis.temp_size_in_bytes / GIB, "mesh_compile_s": compile_s,
        "mesh_bounded_executed": bool(np.isfinite(grad_norm) and grad_norm > 0), "mesh_executed_rows": run_rows,
        "mesh_executed_s": time.perf_counter() - start, "mesh_executed_grad_norm": grad_norm,
    }


SMOLLM2 = ModelConfig(vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3,
                      intermediate_size=1536, tie_word_embeddings=True, max_position_embeddings=8192)
EXACT_SHAPES = {  # model, rows, prompt tokens, completion tokens
    "demo": (None, 256, 16, 16),
    "smollm2": (SMOLLM2, 32, 48, 32),
}
EXACT_PAGE = 16


def exact_child(shape: str, mode: str, steps: int, warmup: int) -> dict:
    """Seconds of ``steps`` train steps at ``shape`` in this process: ``mode`` ``"exact"`` (the step
    of ``trainer.exact_logprobs``; the parent starts this process with the flag) or ``"default"``
    (the step a new run takes by default: shared prefix, completion window)."""
    from runtime.session import step_config

    model, rows, prompt, completion = EXACT_SHAPES[shape]
    overrides = [f"sampling.group_size={GROUP_SIZE}", f"scheduling.groups_per_batch={rows // GROUP_SIZE}",
                 f"sampling.max_tokens={completion}"] + (["trainer.exact_logprobs=true"] if mode == "exact" else [])
    config = load_config(None, overrides).resolved()
    if model is None:
        m = config.model  # the built-in demo's decoder, its character vocabulary rounded up
        model = ModelConfig(vocab_size=64, hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_heads,
                            num_kv_heads=m.num_kv_heads, intermediate_size=m.intermediate_size)
    step = step_config(config, type("M", (), {"config": model})())
    if step.share_prefix:
        step = dataclasses.replace(step, prefix=prompt)
    width = prompt + completion
    batch = random_batch(rows, width, model.vocab_size, seed=0)
    mask_BS = np.zeros((rows, width - 1), bool)
    mask_BS[:, prompt - 1:] = True
    batch = dataclasses.replace(batch, mask_BS=mask_BS, behaviour_BS=np.where(mask_BS, -2.0, 0.0).astype(np.float32))
    batch = jax.device_put(dataclasses.replace(
        batch, tokens_BT=np.concatenate([np.repeat(batch.tokens_BT[::GROUP_SIZE, :prompt], GROUP_SIZE, 0),
                                         batch.tokens_BT[:, prompt:]], axis=1)))
    params = init_params(model, key=jax.random.key(0))
    opt_state = make_optimizer(step).init(params)
    zeros = jnp.zeros((rows, width - 1), jnp.float32)
    current = jnp.ones(rows, bool)
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        params, opt_state, metrics = train_step(params, opt_state, batch, zeros, zeros, current, config=step)
        jax.block_until_ready(metrics)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return {"shape": shape, "mode": mode, "step_s": statistics.median(times), "xla_flags": os.environ.get("XLA_FLAGS", "")}


def exact_speed(shapes: list[str], rounds: int, steps: int, warmup: int) -> dict:
    """``exact_step_over_default``: at each shape, rounds of one process timing the default step
    and one (compiled without fused multiply-adds) timing the exact one; the median over rounds of
    the round's exact step time over its default step time, and the largest over the shapes."""
    from runtime.numerics import exact_env

    plain = {**os.environ, "XLA_FLAGS": " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                                               if not f.startswith("--xla_cpu_max_isa="))}
    result: dict = {}
    for shape in shapes:
        ratios: list[float] = []
        seconds: dict[str, list[float]] = {"default": [], "exact": []}
        for _ in range(rounds):
            for mode, env in (("default", plain), ("exact", exact_env(plain))):
                child = subprocess.run([sys.executable, os.path.abspath(__file__), "--exact-child", shape, mode,
                                        "--repeats", str(steps), "--warmup", str(warmup)],
                                       env=env, capture_output=True, text=True, check=False)
                if child.returncode != 0:
                    raise SystemExit(f"the {mode} step at {shape} failed: {child.stderr.strip().splitlines()[-1:]}")
                seconds[mode].append(json.loads(child.stdout.strip().splitlines()[-1])["step_s"])
            ratios.append(seconds["exact"][-1] / seconds["default"][-1])
        result[f"exact_{shape}"] = {"default_step_s": statistics.median(seconds["default"]),
                                    "exact_step_s": statistics.median(seconds["exact"]),
                                    "ratio_median": statistics.median(ratios), "ratios": ratios}
    result["exact_step_over_default"] = max(result[f"exact_{s}"]["ratio_median"] for s in shapes)
    return result


PACK_MODEL = ModelConfig(vocab_size=8192, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
                         intermediate_size=688)


def packing_speed(repeats: int, rows: int = 32, seed: int = 0) -> dict:
    """The same batch of log-normal lengths (prompts of 32–128 tokens, completions drawn
    log-normally with median 64 and at most 512) through the padded step and the packed one
    (``trainer.pack``), on a small decoder; tokens/s counts the real tokens. Alternated
    ``repeats`` times after a compile and a warm-up each; medians, and the median of each round's
    ratio."""
    from runtime.trainer import Sample, pack, pack_bins

    gen = np.random.default_rng(seed)
    samples = []
    for _ in range(rows // GROUP_SIZE):
        prompt = gen.integers(4, PACK_MODEL.vocab_size, int(gen.integers(32, 129))).astype(np.int32)
        for _ in range(GROUP_SIZE):
            c = int(min(512, max(1, round(gen.lognormal(np.log(64), 0.8)))))
            samples.append(Sample(prompt, gen.integers(4, PACK_MODEL.vocab_size, c).astype(np.int32),
                                  np.full(c, -1.0, np.float32), float(gen.random() < 0.5), 0))
    width = max(len(s.prompt) + len(s.completion) for s in samples)
    real = sum(len(s.prompt) + len(s.completion) for s in samples)
    config = StepConfig(model=PACK_MODEL, objective=configure("grpo"))
    batches = {"padded": (pack(samples, group_size=GROUP_SIZE, width=width, pad_id=0), config),
               "packed": (pack_bins(samples, group_size=GROUP_SIZE, width=width, pad_id=0, multiple=4),
                          StepConfig(model=PACK_MODEL, objective=configure("grpo"), pack=True))}
    params = init_params(PACK_MODEL, key=jax.random.key(seed))
    zeros = jnp.zeros((rows, width - 1), jnp.float32)
    current = jnp.ones((rows,), bool)
    compiled = {}
    for name, (batch, cfg) in batches.items():
        p = jax.tree.map(jnp.array, params)
        o = make_optimizer(cfg).init(p)
        b = jax.device_put(batch)
        fn = train_step.lower(p, o, b, zeros, zeros, current, config=cfg).compile()
        compiled[name] = (fn, p, o, b)

    def once(name: str) -> float:
        fn, p, o, b = compiled[name]
        start = time.perf_counter()
        out = fn(jax.tree.map(jnp.copy, p), jax.tree.map(jnp.copy, o), b, zeros, zeros, current)
        jax.block_until_ready(out)
        return time.perf_counter() - start

    for name in compiled:
        once(name)
    times: dict[str, list[float]] = {"padded": [], "packed": []}
    ratios = []
    for _ in range(repeats):
        for name in times:
            times[name].append(once(name))
        ratios.append(times["padded"][-1] / times["packed"][-1])
    median = {name: statistics.median(t) for name, t in times.items()}
    return {
        "packing_rows": rows, "packing_width": width, "packing_real_tokens": real,
        "packed_rows": int(batches["packed"][0].tokens_BT.shape[0]),
        "padded_tokens_s": real / median["padded"], "packed_tokens_s": real / median["packed"],
        "packed_over_padded": statistics.median(ratios),
    }


def load_baseline_step(ref: str):
    """``runtime/trainer/step.py`` as it is at git revision ``ref``, imported as its own module."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        source = subprocess.run(
            ["git", "-C", root, "show", f"{ref}:runtime/trainer/step.py"],
            check=True, capture_output=True, text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"--baseline-ref {ref!r}: cannot read runtime/trainer/step.py there ({e}); "
                 "give a git revision of this repository")
    with tempfile.NamedTemporaryFile("w", suffix="_baseline_step.py", delete=False) as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("baseline_step", f.name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    os.unlink(f.name)
    return module


def demo_batch(model: ModelConfig, rows: int, seed: int = 0) -> TrainBatch:
    gen = np.random.default_rng(seed)
    tokens = gen.integers(4, model.vocab_size, (rows, DEMO_WIDTH)).astype(np.int32)
    mask = np.zeros((rows, DEMO_WIDTH - 1), bool)
    mask[:, -DEMO_COMPLETION:] = True
    return TrainBatch(
        tokens_BT=tokens,
        attention_BT=np.ones((rows, DEMO_WIDTH), bool),
        mask_BS=mask,
        behaviour_BS=np.where(mask, -2.0, 0.0).astype(np.float32),
        rewards_MG=gen.integers(0, 2, (rows // GROUP_SIZE, GROUP_SIZE)).astype(np.float32),
        versions_B=np.zeros(rows, np.int32),
    )


def program_text(fn, args, config) -> str:
    """The optimized XLA program of ``fn(*args, config=config)``: its instructions only, without
    the metadata (source files, lines, names) that differ between two copies of the same code."""
    text = fn.lower(*args, config=config).compile().as_text()
    lines = [line for line in text.splitlines() if re.match(r"\s*(ROOT )?%|ENTRY|HloModule|}", line)]
    return "\n".join(re.sub(r",? ?metadata=\{[^}]*\}", "", line) for line in lines)


def step_speed(repeats: int, baseline_ref: str, warmup: int = 3) -> dict:
    from runtime.session import builtin_config

    run_config = Config()
    model, _ = builtin_config(run_config)
    rows = run_config.scheduling.groups_per_batch * run_config.sampling.group_size
    objective = run_config.objective()
    baseline = load_baseline_step(baseline_ref)
    t = run_config.trainer
    common = dict(model=model, objective=objective, learning_rate=t.learning_rate)
    steps = {
        "baseline": (baseline.train_step, baseline.StepConfig(**common)),
        "step": (train_step, StepConfig(**common)),
        "bounded": (train_step, StepConfig(**common, micro_batch_size=32, logits_chunk=8,
                                           remat=True)),
    }
    batch = jax.device_put(demo_batch(model, rows))
    S = DEMO_WIDTH - 1
    logp_old = jnp.zeros((rows, S), jnp.float32)
    current = jnp.ones((rows,), bool)
    params0 = init_params(model, key=jax.random.key(0))
    state = {}
    programs = {}
    for name, (fn, config) in steps.items():
        params = jax.tree.map(jnp.array, params0)
        opt = make_optimizer(config).init(params)
        programs[name] = program_text(fn, (params, opt, batch, logp_old, logp_old, current), config)
        for _ in range(1 + warmup):  # the first call compiles
            params, opt, _ = fn(params, opt, batch, logp_old, logp_old, current, config=config)
            jax.block_until_ready(params)
        state[name] = (params, opt)
    times: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for r in range(repeats):
        # Each round starts with another step, so that no step always follows the same one.
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn, config = steps[name]
            params, opt = state[name]
            start = time.perf_counter()
            params, opt, metrics = fn(params, opt, batch, logp_old, logp_old, current, config=config)
            jax.block_until_ready((params, metrics))
            times[name].append(time.perf_counter() - start)
            state[name] = (params, opt)
    tokens = rows * DEMO_WIDTH
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    return {
        "speed_rows": rows,
        "speed_width": DEMO_WIDTH,
        "baseline_ref": baseline_ref,
        "step_tok_s": tokens / medians["step"],
        "baseline_tok_s": tokens / medians["baseline"],
        "bounded_tok_s": tokens / medians["bounded"],
        "step_over_baseline": statistics.median(
            b / s for b, s in zip(times["baseline"], times["step"], strict=True)
        ),
        "step_over_baseline_range": [
            min(b / s for b, s in zip(times["baseline"], times["step"], strict=True)),
            max(b / s for b, s in zip(times["baseline"], times["step"], strict=True)),
        ],
        "same_program_as_baseline": programs["step"] == programs["baseline"],
        "step_ms": {name: [round(1e3 * x, 2) for x in ts] for name, ts in times.items()},
    }


BASELINE_REF = "7e492d8"
"""The step before micro-batches, log-prob chunks, remat and bfloat16 were added to it."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[256, 32])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--logits-chunk", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--baseline-ref", default=BASELINE_REF)
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--no-speed", action="store_true")
    parser.add_argument("--mesh-devices", type=int, default=2,
                        help="the sharded and bounded step's devices (0: skip it)")
    parser.add_argument("--mesh-run-rows", type=int, default=GROUP_SIZE, help="rows of the executed sharded step")
    parser.add_argument("--mesh-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-packing", action="store_true")
    parser.add_argument("--exact-shapes", nargs="*", default=list(EXACT_SHAPES),
                        help="shapes of the exact-log-prob step's cost (none: skip it)")
    parser.add_argument("--exact-rounds", type=int, default=3)
    parser.add_argument("--exact-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.exact_child:  # one mode's step times at one shape (XLA_FLAGS set by the parent)
        shape, mode = args.exact_child
        print(json.dumps(exact_child(shape, mode, steps=args.repeats, warmup=args.warmup)))
        return
    memory = dict(micro_batch_size=args.micro_batch, logits_chunk=args.logits_chunk, remat=True)
    if args.mesh_child:  # a process with --mesh-devices CPU devices (XLA_FLAGS, set by the parent)
        print(json.dumps(mesh_bounded(args.rows[0], args.width, args.mesh_run_rows, **memory)))
        return

    result: dict = {
        "backend": jax.default_backend(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "jax": jax.__version__,
    }
    if not args.no_memory:
        runs = []
        for rows in args.rows:
            runs.append(step_memory(QWEN25_05B, rows, args.width, **memory))
            print(json.dumps(runs[-1]), flush=True)
        params = jax.eval_shape(lambda: init_params(QWEN25_05B, key=jax.random.key(0)))
        result.update(
            model="Qwen2.5-0.5B shape, bfloat16 compute, float32 master weights",
            num_params=sum(x.size for x in jax.tree.leaves(params)),
            width=args.width,
            memory_settings=memory,
            memory=runs,
            temp_gib=runs[0]["temp_gib"],
            temp_ratio_256_vs_32=runs[0]["temp_gib"] / runs[-1]["temp_gib"],
            plain_logits_gib=args.rows[0] * args.width * QWEN25_05B.vocab_size * 4 / GIB,
        )
    if not args.no_packing:
        packing = packing_speed(args.repeats)
        print(json.dumps(packing), flush=True)
        result.update(packing)
    if args.mesh_devices > 1:
        env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={args.mesh_devices}"}
        child = subprocess.run([sys.executable, os.path.abspath(__file__), "--mesh-child", "--rows", str(args.rows[0]),
                                "--width", str(args.width), "--micro-batch", str(args.micro_batch),
                                "--logits-chunk", str(args.logits_chunk), "--mesh-run-rows", str(args.mesh_run_rows)],
                               env=env, capture_output=True, text=True, check=False)
        if child.returncode != 0:
            raise SystemExit(f"the sharded step failed: {child.stderr.strip().splitlines()[-1:]}")
        mesh = json.loads(child.stdout.strip().splitlines()[-1])
        print(json.dumps(mesh), flush=True)
        result.update(mesh)
    if args.exact_shapes:
        exact = exact_speed(args.exact_shapes, args.exact_rounds, steps=5, warmup=2)
        print(json.dumps(exact), flush=True)
        result.update(exact)
    if not args.no_speed:
        speed = step_speed(args.repeats, args.baseline_ref, args.warmup)
        print(json.dumps(speed), flush=True)
        result.update(speed)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
