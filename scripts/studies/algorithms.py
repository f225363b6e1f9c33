#!/usr/bin/env python
"""Every algorithm of the registry on the demo's arithmetic task: held-out pass rate against
steps and against wall time.

Each algorithm of ``kernels.objectives.ALGORITHMS`` (or the ``--algorithms`` given) runs with the
same seeds, step budget and overrides (``--set algorithm.name=NAME``, all else the demo's); the
figure draws the held-out greedy pass rate of the periodic evaluations (``eval.every_steps``)
against the step and against the wall time since the run started; the table gives the run's own
held-out evaluation before and after RL and its steps/min.

Usage (the results in scripts/studies/results/):
    python scripts/studies/algorithms.py [--steps 300] [--seeds 0] [--algorithms grpo rloo ...]
        [--mode threads] [--eval-every N] [--eval-size N] [--set SECTION.FIELD=VALUE]... [--runs DIR]
        [--out DIR]
The last line of output is a JSON object: the figure, the table and each algorithm's results.
"""

from __future__ import annotations

import sys

import common


def main(argv: list[str]) -> None:
    from kernels.objectives import ALGORITHMS

    p = common.parser(__doc__)
    p.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS), metavar="NAME",
                   help="the algorithms to run (default: all of " + ", ".join(ALGORITHMS) + ")")
    args = p.parse_args(argv[1:])
    common.check_args(p, args)
    configs = [common.Study(name, (f"algorithm.name={name}",)) for name in args.algorithms]
    results = common.run_study(args, "algorithms", configs)

    fig, (by_step, by_time) = common.figure(2, f"algorithms, {args.steps} RL steps, seeds {args.seeds}")
    common.plot_pass_rate(by_step, results, "step")
    common.plot_pass_rate(by_time, results, "wall_seconds")
    figure_path = common.save(fig, args.out, "algorithms")

    rows = {label: common.learning(summaries) for label, summaries in results.items()}
    table = [(label, r["start_pass"], r["final_pass"], r["gain_points"], r["steps_per_min"])
             for label, r in rows.items()]
    common.publish(args, "algorithms", "Algorithms on the arithmetic demo", argv, configs,
                   ["algorithm", "start pass", "final pass", "gain (points)", "steps/min"], table, figure_path, rows)


if __name__ == "__main__":
    main(sys.argv)
