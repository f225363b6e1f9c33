"""What the study scripts share: their options, running one config of ``rlx run`` as a
subprocess per seed, reading its ``summary.json``, drawing curves over the runs and writing the
Markdown record (command, overrides, machine, table) and the last-line JSON.

A study is a list of :class:`Study` configs, each a label and the ``--set`` overrides that make
it; every config runs once per seed with the same step budget and the shared base overrides
(workers mode, evaluation cadence and size, any ``--set`` given to the study).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
DEFAULT_OUT = os.path.join(ROOT, "scripts", "studies", "results")
EVAL_POINTS = 6  # periodic held-out evaluations per run when --eval-every is not given
TABLE_NOTE = (
    "Start and final pass: the held-out greedy pass rate that each run measures on versions 0 and final "
    "after RL (`eval_before`, `eval_after` of its summary.json; `eval.size` problems, the ledger's evaluations of those versions). The figure's "
    "points are the periodic evaluations (`eval.size` problems), against the step and against the wall time "
    "since the run started. Steps/min: RL steps per minute of RL time (`steps_per_minute`), with the periodic "
    "evaluations running in a background thread of the same process meanwhile. With several seeds every "
    "value is the mean over seeds."
)


@dataclasses.dataclass(frozen=True)
class Study:
    """One config of a study: a label (a file-name-safe word) and its ``--set`` overrides."""

    label: str
    overrides: tuple[str, ...] = ()


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The options every study takes; a study adds its own (which configs to run)."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300, help="RL steps per run (default 300; the demo runs 1800)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="run seeds (default: 0)")
    p.add_argument("--out", default=DEFAULT_OUT, help="directory for the figure and the Markdown table")
    p.add_argument("--mode", default="threads", help="workers.mode of every run (default threads)")
    p.add_argument("--eval-every", type=int, default=None,
                   help=f"eval.every_steps (default: steps / {EVAL_POINTS}, so about {EVAL_POINTS + 1} points a run)")
    p.add_argument("--eval-size", type=int, default=None, help="eval.size, held-out problems per periodic evaluation "
                   "(default: the config's)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="an override for every run of the study (repeatable)")
    p.add_argument("--runs", default=None, help="keep the run directories here, and reuse a run whose directory "
                   "holds the summary of the same command (default: a temporary directory, removed at the end)")
    return p


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """One line naming a bad option value, as ``argparse`` does."""
    if args.steps < 1:
        p.error(f"--steps {args.steps}: it must be >= 1")
    if args.eval_every is not None and args.eval_every < 1:
        p.error(f"--eval-every {args.eval_every}: it must be >= 1")
    if args.eval_size is not None and args.eval_size < 1:
        p.error(f"--eval-size {args.eval_size}: it must be >= 1")
    if any(s < 0 for s in args.seeds):
        p.error(f"--seeds {' '.join(map(str, args.seeds))}: seeds must be >= 0")


def base_overrides(args: argparse.Namespace) -> list[str]:
    """The overrides every run of the study shares, before its config's own."""
    every = args.eval_every or max(1, args.steps // EVAL_POINTS)
    out = [f"workers.mode={args.mode}", f"eval.every_steps={every}"]
    if args.eval_size is not None:
        out.append(f"eval.size={args.eval_size}")
    return out + list(args.overrides)


def rlx_argv(steps: int, seed: int, out: str, overrides: Sequence[str]) -> list[str]:
    """The ``rlx run`` arguments of one run (after ``python -m runtime.cli``)."""
    argv = ["run", "--steps", str(steps), "--seed", str(seed), "--out", out, "--no-progress"]
    for o in overrides:
        argv += ["--set", o]
    return argv


def run_one(argv: list[str], out: str, log: Callable[[str], None], *, home: str | None = None) -> dict:
    """Run ``rlx`` with ``argv`` into ``out`` (reusing a finished run of the same argv there);
    return its summary.json with the run's argv under ``"argv"`` and the command's wall time
    under ``"command_seconds"`` (the process from start to exit, its start-up and compile
    included). The command's record and log go into ``home`` (default ``out``; a directory above
    ``out`` for a command that wants ``out`` empty or absent, as ``rlx fork`` does)."""
    home = home or out
    record = os.path.join(home, "argv.json")
    summary_path = os.path.join(out, "summary.json")
    if os.path.isfile(summary_path) and os.path.isfile(record):
        with open(record, encoding="utf-8") as f:
            kept = json.load(f)
        if isinstance(kept, list):  # a record written before the wall time was kept
            kept = {"argv": kept}
        if kept.get("argv") == argv:
            log(f"reusing {out}")
            return _read_summary(summary_path, argv, kept.get("seconds", float("nan")))
    shutil.rmtree(home, ignore_errors=True)  # rlx refuses a ledger that already holds the run
    os.makedirs(home)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    log("rlx " + shlex.join(argv))
    started = time.monotonic()
    with open(os.path.join(home, "rlx.log"), "w", encoding="utf-8") as f:
        proc = subprocess.run([sys.executable, "-m", "runtime.cli", *argv], cwd=ROOT, env=env, stdout=f,
                              stderr=subprocess.STDOUT, check=False)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        with open(os.path.join(home, "rlx.log"), encoding="utf-8") as f:
            tail = f.read()[-2000:]
        raise SystemExit(f"rlx failed (exit {proc.returncode}): rlx {shlex.join(argv)}\n{tail}")
    log(f"  done in {seconds:.0f} s")
    with open(record, "w", encoding="utf-8") as f:
        json.dump({"argv": argv, "seconds": seconds}, f)
    return _read_summary(summary_path, argv, seconds)


def _read_summary(path: str, argv: list[str], seconds: float) -> dict:
    with open(path, encoding="utf-8") as f:
        summary = json.load(f)
    summary["argv"] = argv
    summary["command_seconds"] = seconds
    return summary


def run_study(args: argparse.Namespace, name: str, configs: Sequence[Study]) -> dict[str, list[dict]]:
    """Every config once per seed, one after another; the summaries by config label, in seed order."""
    base = base_overrides(args)
    runs_dir = args.runs or tempfile.mkdtemp(prefix=f"rlx-study-{name}-")
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731 - stdout ends with the JSON
    results: dict[str, list[dict]] = {}
    try:
        for c in configs:
            results[c.label] = []
            for seed in args.seeds:
                out = os.path.join(runs_dir, name, f"{c.label}-seed{seed}")
                argv = rlx_argv(args.steps, seed, out, [*base, *c.overrides])
                results[c.label].append(run_one(argv, out, log))
    finally:
        if args.runs is None:
            shutil.rmtree(runs_dir, ignore_errors=True)
    return results


# --- reading summaries -----------------------------------------------------------------------

def mean(values: Sequence[float]) -> float:
    """The mean of the finite values (nan when there are none)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.fmean(finite) if finite else float("nan")


def metric(summary: dict, name: str) -> list[float]:
    """Per-step train metric ``name`` (nan where a step does not report it)."""
    return [float(m.get(name, float("nan"))) for m in summary["metrics"]]


def metric_curve(summaries: Sequence[dict], name: str) -> tuple[list[int], list[float]]:
    """Per-step train metric ``name``: the steps and, at each, the mean over seeds."""
    steps = [m["step"] for m in summaries[0]["metrics"]]
    per_seed = [metric(s, name) for s in summaries]
    return steps, [mean(values) for values in zip(*per_seed, strict=True)]


def eval_curve(summaries: Sequence[dict], x: str) -> tuple[list[float], list[float]]:
    """The held-out greedy pass rate of the periodic evaluations against ``x`` ("step" or
    "wall_seconds"), each point the mean over seeds (the seeds share the evaluated steps)."""
    by_seed = [s["evaluations"] for s in summaries]
    n = min(len(e) for e in by_seed)
    xs = [mean([e[i][x] for e in by_seed]) for i in range(n)]
    ys = [mean([e[i]["greedy_pass_rate"] for e in by_seed]) for i in range(n)]
    return xs, ys


def learning(summaries: Sequence[dict]) -> dict:
    """Start and final held-out greedy pass rate (``eval_before``/``eval_after``, the run's own
    evaluation on ``eval_size`` problems), their difference in points, and steps/min; means
    over seeds."""
    before = mean([s["eval_before"] for s in summaries])
    after = mean([s["eval_after"] for s in summaries])
    return {"start_pass": before, "final_pass": after, "gain_points": 100.0 * (after - before),
            "steps_per_min": mean([s["steps_per_minute"] for s in summaries])}


# --- figures and records ---------------------------------------------------------------------

def figure(panels: int, title: str):
    """A figure of ``panels`` side-by-side axes, drawn with the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, panels, figsize=(6.0 * panels, 4.5), squeeze=False)
    fig.suptitle(title, fontsize=11)
    return fig, list(axes[0])


def plot_pass_rate(ax, results: dict[str, list[dict]], x: str) -> None:
    """Held-out greedy pass rate of each config against ``x`` ("step" or "wall_seconds")."""
    for label, summaries in results.items():
        xs, ys = eval_curve(summaries, x)
        ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.2, label=label)
    ax.set_xlabel("RL step" if x == "step" else "wall time since the run started (s)")
    ax.set_ylabel("held-out greedy pass rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def save(fig, out: str, name: str) -> str:
    """Write ``fig`` to ``out/name.png``; return the path."""
    import matplotlib.pyplot as plt

    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{name}.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cell(value) -> str:
    if isinstance(value, float):
        if not math.isfinite(value):
            return "n/a"
        return f"{value:.3g}" if abs(value) < 1e-2 and value != 0.0 else f"{value:.3f}"
    return str(value)


def publish(args: argparse.Namespace, name: str, title: str, argv: Sequence[str], configs: Sequence[Study],
            columns: Sequence[str], rows: Sequence[Sequence], figure_path: str, results: dict[str, dict],
            notes: Sequence[str] = ()) -> None:
    """Write the study's Markdown record (``_write_markdown``, with ``TABLE_NOTE`` and ``notes``
    above the table), then print the last-line JSON (``finish``)."""
    paragraphs = [TABLE_NOTE, *(line for note in notes for line in ("", note))]
    table_path = _write_markdown(args.out, name, title, argv, args, configs, columns, rows, figure_path, paragraphs)
    finish(figure_path, table_path, results)


def _write_markdown(out: str, name: str, title: str, argv: Sequence[str], args: argparse.Namespace,
                    configs: Sequence[Study], columns: Sequence[str], rows: Sequence[Sequence], figure_path: str,
                    notes: Sequence[str]) -> str:
    """``out/name.md``: the command, what every run shared, each config's overrides, the machine,
    the notes, the table and the figure; return the path."""
    lines = [
        f"# {title}", "",
        "Command:", "", "```", "python " + shlex.join([os.path.relpath(argv[0], ROOT), *argv[1:]]), "```", "",
        f"Each config ran `rlx run --steps {args.steps} --seed SEED` for seeds "
        f"{', '.join(map(str, args.seeds))}, with these overrides shared by all:",
        "", *[f"- `{o}`" for o in base_overrides(args)], "",
        "Config overrides:", "",
        *[f"- {c.label}: " + (", ".join(f"`{o}`" for o in c.overrides) or "none (the defaults)") for c in configs],
        "",
        f"Machine: {os.cpu_count()} cores, {platform.machine()}, {platform.system()}, Python "
        f"{platform.python_version()}; code at {_commit()}. Runs ran one after another.", "",
        *notes, "",
        "| " + " | ".join(columns) + " |",
        "|" + "|".join("---" for _ in columns) + "|",
        *["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows],
        "", f"![{name}]({os.path.basename(figure_path)})", "",
    ]
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{name}.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    return path


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "an unknown commit"
    return f"commit {head}" + (" with uncommitted changes" if dirty else "")


def finish(figure_path: str, table_path: str, results: dict[str, dict]) -> None:
    """Print the last-line JSON: the files and each config's figures (nan as null)."""
    clean = {label: {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
             for label, row in results.items()}
    print(json.dumps({"figure": figure_path, "table": table_path, "results": clean}, sort_keys=True))


__all__ = ["DEFAULT_OUT", "ROOT", "TABLE_NOTE", "Study", "base_overrides", "check_args", "eval_curve", "figure", "finish",
           "learning", "mean", "metric", "metric_curve", "parser", "plot_pass_rate", "publish", "rlx_argv", "run_one",
           "run_study", "save"]
