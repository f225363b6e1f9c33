#!/usr/bin/env python
"""End-to-end throughput of ``rlx run``: worker processes vs threads, staleness 0 vs 1, controller
overhead, trainer overhead.

On the same config (the demo's unless overridden):

1. ``workers.mode="processes"`` against ``"threads"``: ``--mode-repeats`` runs of each, alternating,
   each in a fresh Python process (so neither mode finds the other's compiled programs in memory),
   ``--mode-steps`` steps each; steps/min and rollout tokens/s of every run (from its
   summary.json, whose RL time runs from when the controller is ready to the end of the run),
   their medians and ``processes_vs_threads``, the ratio of the median steps/min. Every run must
   end with the same final digest. Each run also reports, from the controller's start,
   ``first_rollout_s`` (worker start-up and the first generation) and ``first_step_s`` (the first
   committed step, after the train step's compilation), and ``steady_steps_per_min`` (the steps
   after the first). Worker processes load their compiled programs from JAX's
   persistent cache (``runtime.compile_cache``); on a machine where it is empty, the first
   processes run fills it and is the slow one of the median;
2. the run with ``scheduling.max_staleness=0`` and with ``1`` (deterministic mode, in this
   process): steps/hour and rollout tokens/s, and the wall time spent inside the controller and
   ledger (every call a worker makes to the ``ControllerLoop``, which folds, decides and appends;
   in processes mode the service's threads make these calls in this process) as a fraction of
   the RL time;
3. the train step's time against a bare flax/optax loop on the same batches: the same model
   forward, token log-probs, a GRPO-style clipped loss with group advantages and AdamW, written
   directly with ``jax.value_and_grad`` (no objective registry, no metrics).

Usage: python scripts/bench_e2e.py [--steps 30] [--mode-steps 20] [--mode-repeats 3] [--modes-only]
       [--set SECTION.FIELD=VALUE]...
The last line of output is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, ROOT)
MODES = ("threads", "processes")


class Timed:
    """Wraps the controller loop's public calls and sums the time spent in them.

    ``seconds`` is the CPU time of the calling threads inside the calls (``time.thread_time``:
    the work the controller and ledger do, fsync waits excluded); ``wall_seconds`` is wall time,
    which also counts waiting for the GIL and the controller's lock while other threads work.
    """

    METHODS = ("submit", "join", "leases", "complete", "scoring_work", "record_outcomes", "train_task",
               "publish", "expire")

    def __init__(self) -> None:
        self.wall_seconds = 0.0
        self.by_method: dict[str, list[float]] = {}  # name -> [calls, cpu seconds]
        self.lock = threading.Lock()
        self._local = threading.local()  # shared by all wrappers: nested calls count once

    @property
    def seconds(self) -> float:
        return sum(cpu for _, cpu in self.by_method.values())

    def reset(self) -> None:
        self.wall_seconds = 0.0
        self.by_method = {}

    def install(self, cls) -> None:
        for name in self.METHODS:
            original = getattr(cls, name)
            setattr(cls, name, self._wrap(name, original))

    def _wrap(self, name, fn):
        local = self._local

        def timed(*args, **kwargs):
            if getattr(local, "depth", 0):  # nested calls (complete -> submit) count once
                return fn(*args, **kwargs)
            local.depth = 1
            t, c = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                local.depth = 0
                cpu = time.thread_time() - c
                with self.lock:
                    self.wall_seconds += time.perf_counter() - t
                    entry = self.by_method.setdefault(name, [0, 0.0])
                    entry[0] += 1
                    entry[1] += cpu

        return timed


def run_once(overrides: list[str], out: str, timer: Timed) -> dict:
    from runtime.config import load_config
    from runtime.run import run

    timer.reset()
    config = load_config(None, overrides)
    summary = run(config, out, progress=False, log=lambda m: None)
    return {
        "mode": config.workers.mode,
        "steps": summary["steps"],
        "rl_seconds": round(summary["rl_seconds"], 2),
        "total_seconds": round(summary["total_seconds"], 2),
        "steps_per_hour": round(3600 * summary["steps"] / summary["rl_seconds"], 1),
        "rollout_tokens_per_s": round(summary["rollout_tokens_per_s"], 1),
        "controller_ledger_seconds": round(timer.seconds, 3),
        "controller_ledger_fraction": round(timer.seconds / summary["rl_seconds"], 4),
        "controller_ledger_wall_seconds": round(timer.wall_seconds, 3),
        "controller_calls": {name: {"calls": n, "cpu_ms": round(1000 * sec, 1)}
                             for name, (n, sec) in sorted(timer.by_method.items())},
        "eval_before": summary["eval_before"],
        "eval_after": summary["eval_after"],
        "final_digest": summary["final_digest"],
        **timeline(out, config.run.name),
    }


def timeline(out: str, run_id: str) -> dict:
    """Where a run's time went, from the ledger's wall times: the controller's start to the first
    committed step (worker start-up, the first batch and the train step's compilation) and the
    rate of the steps after the first."""
    from ledger import events as ev
    from ledger import open_store
    from runtime.rundir import RunDir

    started = first_rollout = None
    committed = []
    with open_store(RunDir(out).ledger, readonly=True) as store:
        for s in store.read(run_id):
            if started is None and isinstance(s.event, ev.ControllerStarted):
                started = s.wall_time
            elif first_rollout is None and isinstance(s.event, ev.RolloutCompleted):
                first_rollout = s.wall_time
            elif isinstance(s.event, ev.TrainStepCompleted):
                committed.append(s.wall_time)
    assert started is not None and first_rollout is not None and committed, "the run committed no step"
    result = {"first_rollout_s": round(first_rollout - started, 2), "first_step_s": round(committed[0] - started, 2)}
    if len(committed) > 1 and committed[-1] > committed[0]:
        result["steady_steps_per_min"] = round(60 * (len(committed) - 1) / (committed[-1] - committed[0]), 1)
    return result


def child_run(out: str, overrides: list[str]) -> None:
    """One run in this (fresh) process; its result is the last line of output."""
    from runtime.controller import ControllerLoop

    timer = Timed()
    timer.install(ControllerLoop)
    print(json.dumps(run_once(overrides, out, timer)))


def modes(tmp: str, overrides: list[str], repeats: int) -> dict:
    """Processes vs threads: ``repeats`` runs of each, alternating which goes first, each in a
    fresh process; medians and their ratio."""
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(repeats):
        for mode in (MODES if r % 2 == 0 else MODES[::-1]):
            out = os.path.join(tmp, f"{mode}-{r}")
            args = [sys.executable, os.path.abspath(__file__), "--child-run", out]
            for o in [*overrides, f'workers.mode="{mode}"']:
                args += ["--set", o]
            done = subprocess.run(args, stdout=subprocess.PIPE, text=True, check=True)
            run = json.loads(done.stdout.strip().splitlines()[-1])
            runs[mode].append(run)
            print(f"{mode} #{r}: {60 * run['steps'] / run['rl_seconds']:.1f} steps/min, "
                  f"{run['rollout_tokens_per_s']:.0f} tok/s, first rollout after {run['first_rollout_s']} s, first step "
                  f"after {run['first_step_s']} s, then "
                  f"{run.get('steady_steps_per_min')} steps/min", file=sys.stderr)
    digests = {run["final_digest"] for rs in runs.values() for run in rs}
    assert len(digests) == 1, f"the modes' final digests differ: {sorted(digests)}"
    result: dict = {}
    for mode in MODES:
        rs = runs[mode]
        result[f"steps_per_min_{mode}"] = round(statistics.median(60 * x["steps"] / x["rl_seconds"] for x in rs), 2)
        result[f"rollout_tokens_per_s_{mode}"] = round(statistics.median(x["rollout_tokens_per_s"] for x in rs), 1)
        result[f"first_step_s_{mode}"] = statistics.median(x["first_step_s"] for x in rs)
        result[f"total_seconds_{mode}"] = statistics.median(x["total_seconds"] for x in rs)
        result[f"runs_{mode}"] = [{k: x.get(k) for k in ("rl_seconds", "total_seconds", "rollout_tokens_per_s",
                                                         "first_rollout_s", "first_step_s", "steady_steps_per_min",
                                                         "controller_ledger_fraction")}
                                  for x in rs]
    result["processes_vs_threads"] = round(result["steps_per_min_processes"] / result["steps_per_min_threads"], 3)
    result["modes_final_digest"] = digests.pop()
    return result


def trainer_vs_bare(out: str, overrides: list[str], repeats: int) -> dict:
    """Time ``train_step`` and a bare loop on the batches logged by the run in ``out``."""
    import jax
    import jax.numpy as jnp
    import optax

    from ledger import events as ev
    from ledger import open_store
    from runtime.config import Config
    from runtime.controller.workers import TrainRollout, TrainTask
    from runtime.model import forward
    from runtime.params import ParamStore
    from runtime.rundir import RunDir
    from runtime.session import build_session, make_trainer
    from runtime.trainer.step import make_optimizer, train_step

    with open_store(RunDir(out).ledger) as store:
        events = [s.event for s in store.read("run")]
    started = events[0]
    assert isinstance(started, ev.RunStarted)  # a ledger begins with its run
    config = Config.from_dict(started.config)
    session = build_session(config, log=lambda m: None)
    step_config = session.step_config
    requests = {q.rollout_id: q for e in events if isinstance(e, ev.RolloutRequested) for q in e.samples()}
    completions = {e.rollout_id: e for e in events if isinstance(e, ev.RolloutCompleted)}
    outcomes = {e.rollout_id: e for e in events if isinstance(e, ev.OutcomeRecorded)}
    batches = [e for e in events if isinstance(e, ev.BatchFormed)]
    tasks = [TrainTask(b.step, b.step - 1, "", b, tuple(TrainRollout(requests[r], completions[r], outcomes[r])
                                                        for r in b.rollout_ids)) for b in batches]
    trainer = make_trainer(session, ParamStore.open("memory://bench-e2e", create=True), "bench")  # as the run's
    # Pack every batch once, outside the timings: both loops consume the same arrays.
    packed = []
    for t in tasks:
        _, arrays, current, logp_old, logp_ref, batch_config = trainer.prepare(t)
        packed.append((arrays, current, logp_old, logp_ref, batch_config))

    mc = session.model.config
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(config.trainer.learning_rate))
    eps = 0.2

    @jax.jit
    def bare_step(params, opt_state, tokens, attention, mask, rewards):
        def loss_fn(p):
            logits = forward(p, tokens, attention, config=mc)[:, :-1]
            logp_all = jax.nn.log_softmax(logits / config.sampling.temperature, axis=-1)
            logp = jnp.take_along_axis(logp_all, tokens[:, 1:, None], axis=-1)[..., 0]
            adv = (rewards - rewards.mean(1, keepdims=True)) / (rewards.std(1, keepdims=True, ddof=1) + 1e-6)
            adv = adv.reshape(-1, 1)
            ratio = jnp.exp(logp - jax.lax.stop_gradient(logp))
            per_token = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - eps, 1 + eps) * adv)
            per_seq = jnp.sum(per_token * mask, 1) / jnp.maximum(jnp.sum(mask, 1), 1)
            return jnp.mean(per_seq)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def interleaved(*fns) -> list[float]:
        """Best time of each function over ``repeats`` rounds, alternating them within a round."""
        best = [float("inf")] * len(fns)
        for r in range(repeats):
            order = range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))
            for i in order:
                t = time.perf_counter()
                fns[i]()
                best[i] = min(best[i], time.perf_counter() - t)
        return best

    params0 = jax.tree.map(jnp.array, session.model.params)

    def ours():
        p = jax.tree.map(jnp.array, params0)
        s = make_optimizer(step_config).init(p)
        for arrays, current, logp_old, logp_ref, batch_config in packed:
            p, s, m = train_step(p, s, arrays, logp_old, logp_ref, current, config=batch_config)
        jax.block_until_ready(p)

    def bare():
        p = jax.tree.map(jnp.array, params0)
        s = tx.init(p)
        for arrays, *_ in packed:
            p, s, _ = bare_step(p, s, arrays.tokens_BT, arrays.attention_BT,
                                arrays.mask_BS.astype(jnp.float32), arrays.rewards_MG)
        jax.block_until_ready(p)

    ours()
    bare()  # compile both before timing
    t_ours, t_bare = interleaved(ours, bare)
    n = len(packed)
    return {
        "trainer_step_ms": round(1000 * t_ours / n, 2),
        "bare_step_ms": round(1000 * t_bare / n, 2),
        "trainer_vs_bare": round(t_ours / t_bare, 3),
        "trainer_batches": n,
    }


def replay_fraction(out: str, run_seconds: float) -> dict:
    from runtime.replay import replay_run

    t = time.perf_counter()
    report = replay_run(out)
    seconds = time.perf_counter() - t
    assert report.match, report.first_divergence
    return {"replay_seconds": round(seconds, 2), "replay_vs_run": round(seconds / run_seconds, 3)}


def recovery(tmp: str, overrides: list[str]) -> dict:
    """Seconds from ``rlx resume`` to the next committed step after a SIGKILL."""
    import signal
    import sqlite3
    import subprocess

    from runtime import compile_cache

    env = dict(os.environ)
    env.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".jax_cache"))
    env.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(compile_cache.MAX_BYTES))  # as rlx bounds it
    out = os.path.join(tmp, "killed")
    db = os.path.join(out, "ledger.db")
    cli = [sys.executable, "-m", "runtime.cli"]

    def steps() -> int:
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
                return c.execute("select count(*) from rlx_events where kind='TrainStepCompleted'").fetchone()[0]
        except sqlite3.Error:
            return 0

    args = [*cli, "run", "--out", out, "--no-progress"] + [x for o in overrides for x in ("--set", o)]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while steps() < 2 and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = steps()
    t = time.perf_counter()
    proc = subprocess.Popen([*cli, "resume", out, "--no-progress"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    while steps() <= before and proc.poll() is None:
        time.sleep(0.02)
    seconds = time.perf_counter() - t
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return {"recovery_seconds": round(seconds, 2), "killed_after_steps": before}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--mode-steps", type=int, default=20, help="steps of each processes/threads run")
    ap.add_argument("--mode-repeats", type=int, default=3, help="runs of each mode")
    ap.add_argument("--modes-only", action="store_true", help="only the processes vs threads comparison")
    ap.add_argument("--child-run", metavar="OUT", help=argparse.SUPPRESS)
    args = ap.parse_args()

    # Worker processes import this tree's code, like this process.
    os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])
    if args.child_run:
        child_run(args.child_run, args.overrides)
        return

    from runtime.controller import ControllerLoop

    timer = Timed()
    timer.install(ControllerLoop)
    base = [f"run.steps={args.steps}", *args.overrides]
    result: dict = {"steps": args.steps, "overrides": args.overrides, "cores": len(os.sched_getaffinity(0))}
    with tempfile.TemporaryDirectory() as tmp:
        result["mode_steps"] = args.mode_steps
        result.update(modes(tmp, [f"run.steps={args.mode_steps}", *args.overrides], args.mode_repeats))
        print(f"processes {result['steps_per_min_processes']} vs threads {result['steps_per_min_threads']} steps/min "
              f"(median of {args.mode_repeats}): {result['processes_vs_threads']:.3f}x", file=sys.stderr)
        if args.modes_only:
            print(json.dumps(result))
            return
        for k in (0, 1):
            out = os.path.join(tmp, f"k{k}")
            r = run_once([*base, f"scheduling.max_staleness={k}"], out, timer)
            result[f"staleness{k}"] = r
            print(f"max_staleness {k}: {r['steps_per_hour']:.0f} steps/h, {r['rollout_tokens_per_s']:.0f} tok/s, "
                  f"controller+ledger {100 * r['controller_ledger_fraction']:.2f}% of RL time", file=sys.stderr)
        result.update(replay_fraction(os.path.join(tmp, "k1"), result["staleness1"]["total_seconds"]))
        print(f"replay {result['replay_seconds']} s = {result['replay_vs_run']:.2f} of the run", file=sys.stderr)
        result.update(recovery(tmp, [*base, "scheduling.max_staleness=1"]))
        print(f"recovery from SIGKILL to the next committed step: {result['recovery_seconds']} s", file=sys.stderr)
        result.update(trainer_vs_bare(os.path.join(tmp, "k0"), base, args.repeats))
        print(f"train step {result['trainer_step_ms']} ms vs bare loop {result['bare_step_ms']} ms "
              f"({result['trainer_vs_bare']:.3f}x)", file=sys.stderr)
    result["controller_ledger_fraction"] = max(result["staleness0"]["controller_ledger_fraction"],
                                               result["staleness1"]["controller_ledger_fraction"])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
