#!/usr/bin/env python
"""rlx's default demo against a bare single-file JAX GRPO loop, side by side on this machine.

1. rlx: the default ``rlx run`` (the roles as worker processes) in a subprocess; from its
   summary.json the RL steps/min, the greedy held-out pass rates of versions 0 and final
   (``eval_before``, ``eval_after``: 500 problems) and the periodic evaluations (``rlx_curve``:
   ``[version, seconds since RunStarted, greedy pass rate]``).
2. bare: the bare loop's warm start (``warm_a.py --task add3 --eval_every 5``, which stops at the
   first evaluation with a held-out pass rate of at least 30%; run once and reused, it is
   deterministic) then ``grpo_a.py --lr 1e-4`` for as many minutes of RL as rlx's run before it
   took (``rl_seconds``; ``--bare-minutes`` overrides). Its wall time includes its own periodic
   evaluations (500 problems every 60 s), as rlx's RL time includes its background evaluations.
   ``bare_curve``: ``[step, seconds since RL start, greedy pass rate]``.
3. Where rlx's step time goes: a shorter run (``--profile-steps``) of the same config with
   ``workers.mode=threads``, in this process, with the roles' methods wrapped by timers. This
   breakdown comes from a threads-mode run (all roles in one process, sharing the machine's
   cores), while the headline steps/min comes from the default processes mode. Seconds per RL step,
   summed over the threads of each role: ``sampling`` (``EngineWorker.generate``), ``scoring``
   (``TaskVerifier.score``), ``training`` (``train_step`` and the old/reference log-probs'
   ``score``, each blocked on its result), ``trainer_other`` (the rest of ``StepTrainer.train``
   apart from ``ParamStore.put``: packing, host copies), ``publishing`` (``ParamStore.put``),
   ``controller`` (every ``ControllerLoop`` call a worker makes) and ``trainer_waiting`` (RL time
   less ``StepTrainer.train`` time: how long the trainer, the bottleneck role, waits for batches).

Steps 1 and 2 run ``--repeats`` times, alternating which goes first; each figure is the median
over repeats (the ratio is computed per repeat), with ``*_range`` ``[min, max]`` for the steps/min
figures and the ratio. The curves are the first repeat's. The full-size default takes about
14 minutes a repeat (1,800 rlx steps, then the bare loop for as long) on a 2-core machine, with both cores busy.

Usage: python scripts/bench_vs_bare.py [--bare DIR] [--repeats 1] [--steps N] [--profile-steps 100]
       [--bare-minutes M] [--keep DIR] [--set SECTION.FIELD=VALUE]...
The last line of output is a JSON object.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
DEFAULT_BARE = os.path.normpath(os.path.join(ROOT, "..", "shared", "anchors", "bare_grpo"))
BARE_SCRIPTS = ("warm_a.py", "grpo_a.py")
CONTROLLER_METHODS = ("submit", "join", "leave", "heartbeat", "lose", "leases", "complete", "scoring_work",
                      "record_outcomes", "train_task", "publish", "expire")


class Failure(Exception):
    """A step of the benchmark failed; its message is the one line shown."""


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --- running the two loops ----------------------------------------------------------------------

def run_command(argv: Sequence[str], cwd: str, logfile: str) -> str:
    """Run ``argv`` in ``cwd`` (``PYTHONPATH`` starts with this tree, set by :func:`main`), writing
    its output to ``logfile``; its stdout, or :class:`Failure` naming the command and the tail of
    its stderr."""
    log("$ " + shlex.join(argv))
    proc = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, check=False)
    with open(logfile, "w", encoding="utf-8") as f:
        f.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = " | ".join(line.strip() for line in proc.stderr.strip().splitlines()[-3:] if line.strip())
        raise Failure(f"{shlex.join(argv)} (in {cwd}) exited with status {proc.returncode}: {tail[-500:]}")
    return proc.stdout


def rlx_argv(out: str, steps: int | None, overrides: Sequence[str]) -> list[str]:
    """``rlx run`` arguments (after ``python -m runtime.cli``)."""
    argv = ["run", "--out", out, "--no-progress"]
    if steps is not None:
        argv += ["--steps", str(steps)]
    for o in overrides:
        argv += ["--set", o]
    return argv


def read_summary(out: str) -> dict:
    path = os.path.join(out, "summary.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise Failure(f"cannot read {path}: {e}") from e


def run_rlx(out: str, steps: int | None, overrides: Sequence[str]) -> dict:
    """One default ``rlx run`` in a subprocess: its figures from summary.json."""
    run_command([sys.executable, "-m", "runtime.cli", *rlx_argv(out, steps, overrides)], ROOT, out + ".log")
    s = read_summary(out)
    return {
        "steps_per_min": s["steps_per_minute"],
        "start_pass": s["eval_before"],
        "final_pass": s["eval_after"],
        "gain_pts": 100.0 * (s["eval_after"] - s["eval_before"]),
        "rl_seconds": s["rl_seconds"],
        "steps": s["steps"],
        "curve": [[e["version"], e["wall_seconds"], e["greedy_pass_rate"]] for e in s.get("evaluations", [])],
    }


def warm_bare(bare: str, warm: str) -> None:
    """The bare loop's supervised warm start, into ``warm``."""
    run_command([sys.executable, "warm_a.py", "--task", "add3", "--out", warm, "--eval_every", "5"], bare,
                warm + ".log")


def run_bare(bare: str, warm: str, minutes: float, out: str) -> dict:
    """``grpo_a.py`` from the warm start for ``minutes`` of RL: its last-line JSON and its curve."""
    stdout = run_command([sys.executable, "grpo_a.py", "--init", warm, "--lr", "1e-4", "--minutes", f"{minutes:.4f}",
                          "--out", out], bare, out + ".log")
    lines = stdout.strip().splitlines()
    try:
        last = json.loads(lines[-1])
        with open(out, encoding="utf-8") as f:
            curve = json.load(f).get("curve", [])
    except (IndexError, ValueError, OSError) as e:
        raise Failure(f"grpo_a.py gave no last-line JSON and {out}: {e}") from e
    return {
        "steps_per_min": last["steps_per_min"],
        "start_pass": last["start_pass"],
        "final_pass": last["final_pass"],
        "gain_pts": last["gain_pts"],
        "sample_s_per_step": last["samp_s_per_step"],
        "train_s_per_step": last["train_s_per_step"],
        "steps": last["steps"],
        "wall_s": last["wall_s"],
        "curve": [[c["step"], c["t"], c["pass_"]] for c in curve],
    }


# --- where rlx's step time goes -----------------------------------------------------------------

class Clock:
    """Thread-safe wall-time totals of wrapped functions, by label.

    A call made while another call of the same label runs on its thread (``complete`` calling
    ``submit``) counts once. ``within[(outer, label)]`` sums the calls of ``label`` made while
    ``outer`` was running on the same thread. ``restore`` puts back every wrapped attribute.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.calls: collections.Counter[str] = collections.Counter()
        self.within: dict[tuple[str, str], float] = collections.defaultdict(float)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._wrapped: list[tuple[object, str, object, bool]] = []

    def wrap(self, owner: object, name: str, label: str, *, block: bool = False) -> None:
        """Replace ``owner.name`` by a timed call; ``block``: wait for the JAX arrays it returns."""
        original = getattr(owner, name)
        own = name in vars(owner)
        self._wrapped.append((owner, name, vars(owner)[name] if own else original, own))
        setattr(owner, name, self._timed(label, original, block))

    def restore(self) -> None:
        for owner, name, original, own in reversed(self._wrapped):
            if own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)
        self._wrapped = []

    def _timed(self, label: str, fn: Callable, block: bool) -> Callable:
        local = self._local

        def timed(*args, **kwargs):
            stack = local.__dict__.setdefault("stack", [])
            if label in stack:
                return fn(*args, **kwargs)
            stack.append(label)
            t = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
                if block:
                    import jax

                    jax.block_until_ready(out)
                return out
            finally:
                dt = time.perf_counter() - t
                stack.pop()
                with self._lock:
                    self.seconds[label] += dt
                    self.calls[label] += 1
                    for outer in stack:
                        self.within[(outer, label)] += dt

        return timed


def profile(out: str, steps: int, overrides: Sequence[str]) -> dict:
    """A threads-mode run of ``steps`` steps in this process, its roles timed: seconds per RL step."""
    import runtime.workers.trainer as trainer_module
    from runtime.cli import main
    from runtime.controller import ControllerLoop
    from runtime.params import ParamStore
    from runtime.workers.inference import EngineWorker
    from runtime.workers.trainer import StepTrainer
    from runtime.workers.verifier import TaskVerifier

    clock = Clock()
    clock.wrap(EngineWorker, "generate", "sampling")
    clock.wrap(TaskVerifier, "score", "scoring")
    clock.wrap(StepTrainer, "train", "trainer")
    clock.wrap(StepTrainer, "prepare", "prepare")
    clock.wrap(trainer_module, "train_step", "train_step", block=True)
    clock.wrap(trainer_module, "score", "logprobs", block=True)
    clock.wrap(ParamStore, "put", "publishing")
    for name in CONTROLLER_METHODS:
        if hasattr(ControllerLoop, name):
            clock.wrap(ControllerLoop, name, "controller")
    argv = rlx_argv(out, steps, [*overrides, "workers.mode=threads"])
    log("$ rlx " + shlex.join(argv) + "   (in this process, timed)")
    try:
        with contextlib.redirect_stdout(sys.stderr):  # stdout ends with the JSON
            status = main(argv)
    except Exception as e:  # noqa: BLE001 - any failure of the run is reported as one line
        raise Failure(f"rlx {shlex.join(argv)} (in this process) failed: {type(e).__name__}: {e}") from e
    finally:
        clock.restore()
    if status != 0:
        raise Failure(f"rlx {shlex.join(argv)} (in this process) exited with status {status}")
    s = read_summary(out)
    n = max(s["steps"], 1)
    sec = clock.seconds
    training = sec["train_step"] + sec["logprobs"]
    in_train = (clock.within[("trainer", "train_step")] + clock.within[("trainer", "logprobs")]
                + clock.within[("trainer", "publishing")])
    per_step = {
        "rl": s["rl_seconds"],
        "sampling": sec["sampling"],
        "scoring": sec["scoring"],
        "training": training,
        "trainer_other": sec["trainer"] - in_train,
        "publishing": sec["publishing"],
        "controller": sec["controller"],
        "trainer_waiting": s["rl_seconds"] - sec["trainer"],
        "trainer": sec["trainer"],
        "prepare": sec["prepare"],
    }
    result = {k: v / n for k, v in per_step.items()}
    result["steps"] = s["steps"]
    result["steps_per_min"] = s["steps_per_minute"]
    return result


# --- putting it together ------------------------------------------------------------------------

def median_and_range(runs: Sequence[dict], key: str) -> tuple[float, list[float]]:
    values = [r[key] for r in runs]
    return statistics.median(values), [min(values), max(values)]


def combine(rlx: Sequence[dict], bare: Sequence[dict], profiled: dict, repeats: int) -> dict:
    """The last-line JSON: medians over repeats, ranges of the rates, the first repeat's curves."""
    ratios = [{"ratio": r["steps_per_min"] / b["steps_per_min"]} for r, b in zip(rlx, bare, strict=True)]
    result: dict = {}
    result["rlx_steps_per_min"], result["rlx_steps_per_min_range"] = median_and_range(rlx, "steps_per_min")
    result["bare_steps_per_min"], result["bare_steps_per_min_range"] = median_and_range(bare, "steps_per_min")
    result["ratio"], result["ratio_range"] = median_and_range(ratios, "ratio")
    for prefix, runs in (("rlx", rlx), ("bare", bare)):
        for key in ("start_pass", "final_pass", "gain_pts", "steps"):
            result[f"{prefix}_{key}"] = statistics.median(r[key] for r in runs)
    result["rl_seconds"] = statistics.median(r["rl_seconds"] for r in rlx)
    result["bare_wall_seconds"] = statistics.median(b["wall_s"] for b in bare)
    result["bare_sample_s_per_step"] = statistics.median(b["sample_s_per_step"] for b in bare)
    result["bare_train_s_per_step"] = statistics.median(b["train_s_per_step"] for b in bare)
    result["rlx_time_per_step"] = profiled
    result["rlx_curve"] = rlx[0]["curve"]
    result["bare_curve"] = bare[0]["curve"]
    result["rlx_runs"] = [{k: v for k, v in r.items() if k != "curve"} for r in rlx]
    result["bare_runs"] = [{k: v for k, v in b.items() if k != "curve"} for b in bare]
    result["cores"] = len(os.sched_getaffinity(0))
    result["repeats"] = repeats
    return result


def table(result: dict) -> str:
    rows = [("", "rlx", "bare"),
            ("steps/min", f"{result['rlx_steps_per_min']:.1f}", f"{result['bare_steps_per_min']:.1f}"),
            ("RL steps", f"{result['rlx_steps']:g}", f"{result['bare_steps']:g}"),
            ("start pass", f"{result['rlx_start_pass']:.1%}", f"{result['bare_start_pass']:.1%}"),
            ("final pass", f"{result['rlx_final_pass']:.1%}", f"{result['bare_final_pass']:.1%}"),
            ("gain (points)", f"{result['rlx_gain_pts']:+.1f}", f"{result['bare_gain_pts']:+.1f}")]
    lines = [f"{a:<16}{b:>10}{c:>10}" for a, b, c in rows]
    lo, hi = result["ratio_range"]
    lines.append(f"rlx/bare steps/min: {result['ratio']:.3f} (range {lo:.3f}-{hi:.3f}, {result['repeats']} repeats); "
                 f"RL time {result['rl_seconds']:.0f} s each")
    lines.append(f"bare s/step: sample {result['bare_sample_s_per_step']:.3f}, train {result['bare_train_s_per_step']:.3f}")
    t = result["rlx_time_per_step"]
    lines.append(f"rlx s/step ({t['steps']}-step threads-mode run, {t['rl']:.3f} s/step):")
    for key in ("sampling", "scoring", "training", "trainer_other", "publishing", "controller", "trainer_waiting"):
        lines.append(f"  {key:<16}{t[key]:8.4f}")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--bare", default=DEFAULT_BARE, help=f"the bare loop's folder (default {DEFAULT_BARE})")
    p.add_argument("--repeats", type=int, default=1, help="runs of each loop, alternating which goes first")
    p.add_argument("--steps", type=int, default=None, help="RL steps of the rlx runs (default: the demo's)")
    p.add_argument("--profile-steps", type=int, default=100, help="RL steps of the timed threads-mode run")
    p.add_argument("--bare-minutes", type=float, default=None,
                   help="RL minutes of the bare loop (default: the rlx run's RL time)")
    p.add_argument("--keep", default=None, help="keep the run directories here (default: a temporary directory)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="an override for the rlx runs (repeatable)")
    args = p.parse_args(argv)
    problem = None
    missing = [s for s in BARE_SCRIPTS if not os.path.isfile(os.path.join(args.bare, s))]
    if args.repeats < 1:
        problem = f"--repeats {args.repeats}: it must be >= 1"
    elif args.steps is not None and args.steps < 1:
        problem = f"--steps {args.steps}: it must be >= 1"
    elif args.profile_steps < 1:
        problem = f"--profile-steps {args.profile_steps}: it must be >= 1"
    elif args.bare_minutes is not None and not args.bare_minutes > 0:
        problem = f"--bare-minutes {args.bare_minutes}: it must be > 0"
    elif missing:
        problem = f"--bare {args.bare}: no {' or '.join(missing)} there (the bare GRPO loop's folder)"
    elif args.keep is not None and os.path.exists(args.keep) and (not os.path.isdir(args.keep) or os.listdir(args.keep)):
        problem = f"--keep {args.keep}: it must be a new or empty directory"
    if problem:
        print(f"{os.path.basename(__file__)}: error: {problem}", file=sys.stderr)
        sys.exit(2)
    args.bare = os.path.abspath(args.bare)
    return args


def bench(args: argparse.Namespace, work: str) -> dict:
    warm = os.path.join(work, "warm.pkl")
    rlx: list[dict] = []
    bare: list[dict] = []
    for r in range(args.repeats):
        order = ("rlx", "bare") if r % 2 == 0 else ("bare", "rlx")
        for which in order:
            if which == "rlx":
                rlx.append(run_rlx(os.path.join(work, f"rlx-{r}"), args.steps, args.overrides))
                log(f"rlx #{r}: {rlx[-1]['steps_per_min']:.1f} steps/min, {rlx[-1]['steps']} steps in "
                    f"{rlx[-1]['rl_seconds']:.1f} s, {rlx[-1]['start_pass']:.1%} -> {rlx[-1]['final_pass']:.1%}")
            else:
                if not os.path.exists(warm):
                    warm_bare(args.bare, warm)
                minutes = args.bare_minutes or rlx[-1]["rl_seconds"] / 60.0
                bare.append(run_bare(args.bare, warm, minutes, os.path.join(work, f"bare-{r}.json")))
                log(f"bare #{r}: {bare[-1]['steps_per_min']:.1f} steps/min, {bare[-1]['steps']} steps in "
                    f"{bare[-1]['wall_s']:.1f} s, {bare[-1]['start_pass']:.1%} -> {bare[-1]['final_pass']:.1%}")
    profiled = profile(os.path.join(work, "profile"), args.profile_steps, args.overrides)
    return combine(rlx, bare, profiled, args.repeats)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # rlx's subprocesses and the worker processes of any run import this tree's code.
    os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])
    if args.keep is not None:
        os.makedirs(args.keep, exist_ok=True)
    work = os.path.abspath(args.keep) if args.keep is not None else tempfile.mkdtemp(prefix="rlx-vs-bare-")
    try:
        result = bench(args, work)
    except Failure as e:
        print(f"{os.path.basename(__file__)}: error: {e}", file=sys.stderr)
        return 1
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(table(result))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
