#!/usr/bin/env python
"""Paired comparison by forks: does a setting changed from version V on help, measured on forks
that share their parent's history and random numbers, against the same comparison from
independent seeds.

For every seed a parent run (the baseline config) runs ``--steps`` RL steps, keeping the versions
a fork at ``--at`` needs; for every setting, ``rlx fork PARENT --at V --set …`` runs from there to
the same final step. The paired difference of a setting is the mean over seeds of (the fork's
held-out greedy pass rate at the final version) − (its parent's), with a Student-t confidence
interval over the seeds. The independent arm runs every setting from the start, with seeds of
its own (``seed + 1000·j`` for the j-th setting), and compares their mean with the parents' (which
are the baseline's full runs) — the difference of two means, with Welch's interval. A setting
with no override is a fork that changes nothing: it ends on its parent's weights, so its paired
difference is exactly 0.

``variance_ratio`` is the variance of the independent arm's estimate over the paired one's;
``wall_ratio`` the wall time of the independent arm (the parents and the setting's full runs)
over the fork arm's (the parents and the setting's forks), each command timed from start to exit.
The two arms do not estimate quite the same thing: a fork measures the change from version V
on, the independent runs the change from the start.

Usage (the results in scripts/studies/results/forks.md):
    python scripts/studies/forks.py [--steps 300] [--at V] [--seeds 0 1 2 3 4]
        [--setting LABEL [SECTION.FIELD=VALUE ...]]... [--mode threads] [--eval-every N]
        [--eval-size N] [--set SECTION.FIELD=VALUE]... [--runs DIR] [--out DIR]
The last line of output is a JSON object: the figure, the table and each setting's figures.
"""

from __future__ import annotations

import math
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
from collections.abc import Sequence

import common

DEFAULT_SETTINGS = [["lr4e-4", "trainer.learning_rate=4e-4"]]
CONFIDENCE = 0.95
INDEPENDENT_SEED_STRIDE = 1000


# --- statistics (pure) -----------------------------------------------------------------------

def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (p > 0.5) of Student's t with ``df`` degrees of freedom: the CDF, by
    Simpson's rule over the density from 0, inverted by bisection (no SciPy in the project)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(x: float, n: int = 2000) -> float:
        h = x / n
        f = [c * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(n + 1)]
        return 0.5 + h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def paired(differences: Sequence[float]) -> dict:
    """Mean of the per-seed differences, the variance of that mean (s²/n) and its t interval."""
    n = len(differences)
    d = statistics.fmean(differences)
    var = statistics.variance(differences) / n
    half = t_quantile((1 + CONFIDENCE) / 2, n - 1) * math.sqrt(var) if var > 0 else 0.0
    return {"diff": d, "var": var, "ci": [d - half, d + half]}


def independent(a: Sequence[float], b: Sequence[float]) -> dict:
    """mean(a) − mean(b) of two independent samples, the variance of that difference
    (s_a²/n_a + s_b²/n_b) and Welch's t interval (Welch–Satterthwaite degrees of freedom)."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    d, var = statistics.fmean(a) - statistics.fmean(b), va + vb
    if var == 0:
        return {"diff": d, "var": 0.0, "ci": [d, d]}
    df = var ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = t_quantile((1 + CONFIDENCE) / 2, df) * math.sqrt(var)
    return {"diff": d, "var": var, "ci": [d - half, d + half]}


def ratio(num: float, den: float) -> float | None:
    """num / den, None where den is 0 (a fork that changes nothing has no paired variance)."""
    return num / den if den > 0 else None


# --- the runs --------------------------------------------------------------------------------

def settings_of(p, raw: list[list[str]] | None) -> list[common.Study]:
    """The ``--setting LABEL [OVERRIDE …]`` options as studies; one line for a bad one."""
    from runtime.fork import changeable

    allowed = set(changeable())
    out = []
    for label, *overrides in raw or DEFAULT_SETTINGS:
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", label) or label == "parent":
            p.error(f"--setting {label}: a label is a file-name-safe word other than 'parent'")
        for o in overrides:
            key = o.split("=", 1)[0].strip()
            if "=" not in o or not any(key == a or key.startswith(a + ".") for a in allowed):
                p.error(f"--setting {label} {o}: a fork may change only {', '.join(sorted(allowed))} "
                        "(as SECTION.FIELD=VALUE)")
        out.append(common.Study(label, tuple(overrides)))
    if len({s.label for s in out}) != len(out):
        p.error("--setting: labels must differ")
    return out


def run_arms(args, at: int, settings: Sequence[common.Study]) -> dict:
    """The parents, every setting's forks and its independent runs; their summaries."""
    base = common.base_overrides(args)
    keep = f"params.keep_newest={args.steps + 1}"  # every version: a fork takes all the unretired ones at V
    runs_dir = args.runs or tempfile.mkdtemp(prefix="rlx-study-forks-")
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731 - stdout ends with the JSON
    got: dict = {"parent": [], "fork": {}, "independent": {}}
    try:
        root = os.path.join(runs_dir, "forks")
        for s in settings:
            got["fork"][s.label], got["independent"][s.label] = [], []
        # Seed by seed, so that a change in the machine's load falls on both arms alike.
        for seed in args.seeds:
            parent = os.path.join(root, f"parent-seed{seed}")
            got["parent"].append(common.run_one(common.rlx_argv(args.steps, seed, parent, [*base, keep]), parent, log))
            for j, s in enumerate(settings, start=1):
                home = os.path.join(root, f"{s.label}-fork-seed{seed}")
                out = os.path.join(home, "run")
                argv = ["fork", parent, "--at", str(at), "--out", out, "--no-progress"]
                for o in s.overrides:
                    argv += ["--set", o]
                got["fork"][s.label].append(common.run_one(argv, out, log, home=home))
                other = seed + INDEPENDENT_SEED_STRIDE * j
                out = os.path.join(root, f"{s.label}-seed{other}")
                argv = common.rlx_argv(args.steps, other, out, [*base, *s.overrides])
                got["independent"][s.label].append(common.run_one(argv, out, log))
    finally:
        if args.runs is None:
            shutil.rmtree(runs_dir, ignore_errors=True)
    return got


def compare(got: dict, settings: Sequence[common.Study]) -> dict[str, dict]:
    """Each setting's paired and independent differences in final held-out pass rate, their
    intervals, the variance and wall-time ratios."""
    parents = got["parent"]
    base = [s["eval_after"] for s in parents]
    parent_s = sum(s["command_seconds"] for s in parents)
    rows = {}
    for s in settings:
        forks, indep = got["fork"][s.label], got["independent"][s.label]
        pair = paired([f["eval_after"] - b for f, b in zip(forks, base, strict=True)])
        ind = independent([r["eval_after"] for r in indep], base)
        fork_s = parent_s + sum(f["command_seconds"] for f in forks)
        indep_s = parent_s + sum(r["command_seconds"] for r in indep)
        rows[s.label] = {
            "paired_diff": pair["diff"], "paired_ci": pair["ci"], "paired_var": pair["var"],
            "independent_diff": ind["diff"], "independent_ci": ind["ci"], "independent_var": ind["var"],
            "variance_ratio": ratio(ind["var"], pair["var"]), "wall_ratio": ratio(indep_s, fork_s),
            "fork_arm_s": fork_s, "independent_arm_s": indep_s,
            "same_final_digest": [f["final_digest"] == p["final_digest"] for f, p in zip(forks, parents, strict=True)],
            "parent_pass": base, "fork_pass": [f["eval_after"] for f in forks],
            "independent_pass": [r["eval_after"] for r in indep],
            "parent_s": [r["command_seconds"] for r in parents], "fork_s": [f["command_seconds"] for f in forks],
            "independent_s": [r["command_seconds"] for r in indep],
        }
    return rows


# --- the record ------------------------------------------------------------------------------

def plot(rows: dict[str, dict], out: str, title: str) -> str:
    fig, (ax,) = common.figure(1, title)
    for i, r in enumerate(rows.values()):
        for dx, arm, color in ((-0.1, "paired", "C0"), (0.1, "independent", "C1")):
            d, (lo, hi) = 100 * r[f"{arm}_diff"], r[f"{arm}_ci"]
            ax.errorbar([i + dx], [d], yerr=[[d - 100 * lo], [100 * hi - d]], fmt="o", color=color, capsize=4,
                        label=("forks (paired)" if arm == "paired" else "independent seeds") if i == 0 else None)
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(rows)), list(rows))
    ax.set_xlim(-0.5, len(rows) - 0.5)
    ax.set_ylabel(f"final held-out pass rate − baseline (points, {CONFIDENCE:.0%} CI)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return common.save(fig, out, "forks")


def _ci(lo: float, hi: float) -> str:
    return f"[{100 * lo:+.1f}, {100 * hi:+.1f}]"


def write_markdown(args, at: int, argv: Sequence[str], settings, rows, figure_path: str) -> str:
    seeds = ", ".join(map(str, args.seeds))
    lines = [
        "# Paired comparison by forks against independent seeds", "",
        "Command:", "", "```", "python " + " ".join([os.path.relpath(argv[0], common.ROOT), *argv[1:]]), "```", "",
        f"Parents: `rlx run --steps {args.steps} --seed SEED` for seeds {seeds} (the baseline config), with these "
        f"overrides shared by every run:", "", *[f"- `{o}`" for o in common.base_overrides(args)], "",
        f"Forks: `rlx fork PARENT --at {at} --set …` per setting and seed, run to step {args.steps}. Independent "
        f"runs: `rlx run --steps {args.steps}` per setting with seeds SEED + {INDEPENDENT_SEED_STRIDE}·j (j-th "
        "setting), compared with the parents (the baseline's full runs). Settings:", "",
        *[f"- {s.label}: " + (", ".join(f"`{o}`" for o in s.overrides) or "none (a fork that changes nothing)")
          for s in settings], "",
        f"Machine: {os.cpu_count()} cores, {platform.machine()}, {platform.system()}, Python "
        f"{platform.python_version()}; code at {common._commit()}. Runs ran one after another.", "",
        "Difference: the final version's held-out greedy pass rate (`eval_after` of summary.json, the "
        "`VersionEvaluated` of the same `eval.size` held-out problems) minus the baseline's, in points. "
        f"Paired: the mean over seeds of fork − its parent, with a {CONFIDENCE:.0%} Student-t interval; "
        "independent: mean of the setting's runs − mean of the parents, with Welch's interval. Variance "
        "ratio: the variance of the independent estimate (s²/n + s²/n) over the paired one's (s_d²/n). Wall "
        "ratio: wall time of the independent arm (parents + the setting's full runs) over the fork arm's "
        "(parents + the setting's forks), every command timed from start to exit.", "",
        "| setting | paired diff | paired CI | independent diff | independent CI | variance ratio | "
        "fork arm (s) | independent arm (s) | wall ratio |",
        "|---|---|---|---|---|---|---|---|---|",
        *[f"| {label} | {100 * r['paired_diff']:+.2f} | {_ci(*r['paired_ci'])} | {100 * r['independent_diff']:+.2f} | "
          f"{_ci(*r['independent_ci'])} | "
          + ("n/a" if r["variance_ratio"] is None else f"{r['variance_ratio']:.1f}")
          + f" | {r['fork_arm_s']:.0f} | {r['independent_arm_s']:.0f} | {r['wall_ratio']:.2f} |"
          for label, r in rows.items()], "",
        "Final held-out pass rate per seed (parent; fork; independent run):", "",
        *[f"- {label}: parents {_rates(r['parent_pass'])}; forks {_rates(r['fork_pass'])}; independent "
          f"{_rates(r['independent_pass'])}" for label, r in rows.items()], "",
        "Wall time per command, seconds (parent; fork; independent run):", "",
        *[f"- {label}: parents {_seconds(r['parent_s'])}; forks {_seconds(r['fork_s'])}; independent "
          f"{_seconds(r['independent_s'])}" for label, r in rows.items()], "",
        f"![forks]({os.path.basename(figure_path)})", "",
    ]
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "forks.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    return path


def _seconds(values: Sequence[float]) -> str:
    return " ".join(f"{v:.0f}" for v in values)


def _rates(values: Sequence[float]) -> str:
    return " ".join(f"{100 * v:.0f}%" for v in values)


def main(argv: list[str]) -> None:
    import json

    p = common.parser(__doc__)
    p.set_defaults(seeds=[0, 1, 2, 3, 4])
    p.add_argument("--at", type=int, default=None, help="the fork version V (default: 4/5 of --steps)")
    p.add_argument("--setting", dest="settings", nargs="+", action="append", metavar="LABEL [SECTION.FIELD=VALUE]",
                   help="a label and the settings its forks change (repeatable; a label alone: a fork that changes "
                        "nothing; default: " + " ".join(DEFAULT_SETTINGS[0]) + ")")
    args = p.parse_args(argv[1:])
    common.check_args(p, args)
    at = args.steps * 4 // 5 if args.at is None else args.at
    if not 0 <= at < args.steps:
        p.error(f"--at {at}: it must be >= 0 and < --steps ({args.steps})")
    if len(set(args.seeds)) < 2 or len(set(args.seeds)) != len(args.seeds):
        p.error(f"--seeds {' '.join(map(str, args.seeds))}: an interval needs at least 2 different seeds")
    if args.eval_every is None:
        args.eval_every = args.steps  # versions 0 and final: all the comparison reads
    settings = settings_of(p, args.settings)

    got = run_arms(args, at, settings)
    rows = compare(got, settings)
    figure_path = plot(rows, args.out, f"forks at version {at} of {args.steps} against independent seeds, "
                                       f"{len(args.seeds)} seeds")
    table = write_markdown(args, at, argv, settings, rows, figure_path)
    print(json.dumps({"figure": figure_path, "table": table, "steps": args.steps, "at": at, "seeds": args.seeds,
                      "results": rows}, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv)
