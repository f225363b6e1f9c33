#!/usr/bin/env python
"""Staleness bound against throughput and learning: ``scheduling.max_staleness`` 0, 1, 2, 4 in
``scheduling.mode`` deterministic and freshest, on the demo's arithmetic task.

Every (mode, staleness) config runs with the same seeds, step budget and overrides; the figure
draws the held-out greedy pass rate of the periodic evaluations against the step and against the
wall time since the run started; the table gives steps/min, the run's own held-out evaluation
before and after RL, and the staleness of the trained rollouts (per-step metrics
``staleness_mean`` and ``staleness_max``, averaged and maximised over the steps).

Usage (the results in scripts/studies/results/):
    python scripts/studies/staleness.py [--steps 300] [--seeds 0] [--staleness 0 1 2 4]
        [--modes deterministic freshest] [--mode threads] [--eval-every N] [--eval-size N]
        [--set SECTION.FIELD=VALUE]... [--runs DIR] [--out DIR]
The last line of output is a JSON object: the figure, the table and each config's results.
"""

from __future__ import annotations

import sys

import common


def main(argv: list[str]) -> None:
    from runtime.config import MODES

    p = common.parser(__doc__)
    p.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2, 4], metavar="N",
                   help="scheduling.max_staleness values (default 0 1 2 4)")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES),
                   help="scheduling.mode values (default: " + " ".join(MODES) + ")")
    args = p.parse_args(argv[1:])
    common.check_args(p, args)
    if any(n < 0 for n in args.staleness):
        p.error(f"--staleness {' '.join(map(str, args.staleness))}: values must be >= 0")
    configs = [common.Study(f"{mode}-s{n}", (f"scheduling.mode={mode}", f"scheduling.max_staleness={n}"))
               for mode in args.modes for n in args.staleness]
    results = common.run_study(args, "staleness", configs)

    fig, (by_step, by_time) = common.figure(2, f"max_staleness × mode, {args.steps} RL steps, seeds {args.seeds}")
    common.plot_pass_rate(by_step, results, "step")
    common.plot_pass_rate(by_time, results, "wall_seconds")
    figure_path = common.save(fig, args.out, "staleness")

    rows = {}
    for label, summaries in results.items():
        rows[label] = {
            **common.learning(summaries),
            "staleness_mean": common.mean([common.mean(common.metric(s, "staleness_mean")) for s in summaries]),
            "staleness_max": max((v for s in summaries for v in common.metric(s, "staleness_max")),
                                 default=float("nan")),
        }
    table = [(label, r["steps_per_min"], r["start_pass"], r["final_pass"], r["gain_points"], r["staleness_mean"],
              r["staleness_max"]) for label, r in rows.items()]
    common.publish(
        args, "staleness", "Staleness bound and scheduling mode", argv, configs,
        ["config", "steps/min", "start pass", "final pass", "gain (points)", "mean staleness", "max staleness"],
        table, figure_path, rows,
        notes=["Mean staleness: the mean over steps of each step's `staleness_mean` (the version the step starts "
               "from minus the version that sampled each rollout of its batch, averaged over the batch); max "
               "staleness: the largest `staleness_max` of any step."])


if __name__ == "__main__":
    main(sys.argv)
