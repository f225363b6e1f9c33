#!/usr/bin/env python
"""Inference/trainer log-prob mismatch per step, and learning with and without the truncated
importance-sampling correction, in float32 and bfloat16, on the demo's arithmetic task.

For every compute dtype (``--set model.dtype=D``) the demo runs without the correction and with
``--set algorithm.options={tis_cap=C}`` (every token weighted by ``min(π_old/π_behaviour, C)``),
with the same seeds, step budget and overrides. The figure draws each step's
``logprob_mismatch_max`` and ``logprob_mismatch_mean`` (``|log π_old − log π_behaviour|`` over the
batch's response tokens: the trainer's recomputed log-prob against the inference engine's) on a
log scale, and the held-out greedy pass rate of the periodic evaluations against the step.
Every config but the exact ones recomputes the old log-probs (``trainer.old_logprobs=recompute``):
a float32 run would otherwise take the engine's for older rollouts, whose mismatch is 0 by
construction. A third config per dtype runs ``trainer.exact_logprobs=true`` (no correction): the
trainer computes each sampled token's log-prob with the engine's operations, so its mismatch on the
on-policy rows, the rows it computes them for, is 0.0 (``--no-exact`` leaves it out).

Usage (the results in scripts/studies/results/):
    python scripts/studies/alignment.py [--steps 300] [--seeds 0] [--dtypes float32 bfloat16]
        [--tis-cap 2.0] [--no-exact] [--mode threads] [--eval-every N] [--eval-size N]
        [--set SECTION.FIELD=VALUE]... [--runs DIR] [--out DIR]
The last line of output is a JSON object: the figure, the table and each config's results.
A dtype other than float32 warm-starts its own model once (the warm-start cache is per dtype).
"""

from __future__ import annotations

import sys

import common


def main(argv: list[str]) -> None:
    from runtime.model.config import DTYPES

    p = common.parser(__doc__)
    p.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES),
                   help="model.dtype values (default: " + " ".join(DTYPES) + ")")
    p.add_argument("--tis-cap", type=float, default=2.0, help="algorithm.options.tis_cap of the corrected runs")
    p.add_argument("--no-exact", dest="exact", action="store_false",
                   help="leave out the runs with trainer.exact_logprobs=true")
    args = p.parse_args(argv[1:])
    common.check_args(p, args)
    if not args.tis_cap > 0.0:
        p.error(f"--tis-cap {args.tis_cap}: it must be > 0")
    configs = [study for dtype in args.dtypes for study in (
        *(common.Study(f"{dtype}-{'tis' if tis else 'none'}",
                       (f"model.dtype={dtype}", "trainer.old_logprobs=recompute",
                        *([f"algorithm.options={{tis_cap={args.tis_cap}}}"] if tis else [])))
          for tis in (False, True)),
        *([common.Study(f"{dtype}-exact", (f"model.dtype={dtype}", "trainer.exact_logprobs=true"))]
          if args.exact else []),
    )]
    results = common.run_study(args, "alignment", configs)

    fig, (mismatch, by_step) = common.figure(2, f"log-prob mismatch and TIS, {args.steps} RL steps, seeds {args.seeds}")
    for i, (label, summaries) in enumerate(results.items()):
        for name, style in (("logprob_mismatch_max", "-"), ("logprob_mismatch_mean", "--")):
            steps, per_step = common.metric_curve(summaries, name)
            shown = [(x, y) for x, y in zip(steps, per_step, strict=True) if y > 0.0]  # a log scale has no 0
            zero = f": 0.0 on {len(per_step) - len(shown)} steps" if len(shown) < len(per_step) else ""
            mismatch.plot([x for x, _ in shown], [y for _, y in shown], style, color=f"C{i}", linewidth=1.1,
                          label=f"{label} {name.rsplit('_', 1)[1]}{zero}")
    mismatch.set_yscale("log")
    mismatch.set_xlabel("RL step")
    mismatch.set_ylabel("|log π_trainer − log π_inference| (nats)")
    mismatch.grid(alpha=0.3, which="both")
    mismatch.legend(fontsize=7)
    common.plot_pass_rate(by_step, results, "step")
    figure_path = common.save(fig, args.out, "alignment")

    rows = {}
    for label, summaries in results.items():
        rows[label] = {
            **common.learning(summaries),
            "mismatch_max": max((v for s in summaries for v in common.metric(s, "logprob_mismatch_max")),
                                default=float("nan")),
            "mismatch_mean": common.mean([common.mean(common.metric(s, "logprob_mismatch_mean")) for s in summaries]),
            "tis_weight_mean": common.mean([common.mean(common.metric(s, "tis_weight_mean")) for s in summaries]),
        }
    table = [(label, r["mismatch_max"], r["mismatch_mean"], r["tis_weight_mean"], r["start_pass"], r["final_pass"],
              r["gain_points"], r["steps_per_min"]) for label, r in rows.items()]
    common.publish(
        args, "alignment", "Inference/trainer log-prob mismatch and truncated importance sampling", argv, configs,
        ["config", "max mismatch", "mean mismatch", "mean TIS weight", "start pass", "final pass", "gain (points)",
         "steps/min"], table, figure_path, rows,
        notes=["Max mismatch: the largest `logprob_mismatch_max` of any step; mean mismatch: the mean over steps "
               "of `logprob_mismatch_mean` (nats, over response tokens). Mean TIS weight: the mean over steps of "
               "`tis_weight_mean`, the mean over tokens of π_old/π_behaviour (capped at tis_cap in the corrected runs, "
               "where it weights the loss; uncapped and unused in the others)."])


if __name__ == "__main__":
    main(sys.argv)
