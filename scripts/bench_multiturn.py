#!/usr/bin/env python
"""Multi-turn tool use end to end: a run whose rollouts are episodes with a calculator.

    python scripts/bench_multiturn.py [--steps 60] [--out DIR] [--seed 0]

Runs ``rlx run`` on the built-in three-digit sums with ``episodes.tools=["calculator"]``: a small
built-in model whose warm start is worked episodes (a calculator call, the result as the
environment appends it, the answer), then RL. Reports the episodes and their mean turns; the
share of trained rows that are exactly the recorded ids with only the model's ids masked in
(``runtime.episodes.check``, must be 1.0); whether ``rlx replay`` is bit-exact with every tool
unable to run (each tool's ``run`` raises in the replaying process: the replay re-derives every
episode from the recorded results); the held-out greedy pass rate before RL (version 0, after the
warm start) and after, and the gain in points. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG = ['episodes.tools=["calculator"]', "episodes.turn_tokens=40", "sampling.max_tokens=64",
          "model.hidden_size=64", "model.num_layers=2", "model.num_heads=4", "model.num_kv_heads=2",
          "model.intermediate_size=128", "pretrain.steps=150", "pretrain.batch_size=32", "pretrain.learning_rate=3e-3",
          "scheduling.groups_per_batch=8", "sampling.group_size=8", "trainer.learning_rate=3e-4", "eval.size=200",
          "workers.inference_slots=64"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="where the run goes (default: a temporary directory)")
    args = parser.parse_args()

    root = pathlib.Path(args.out or tempfile.mkdtemp(prefix="bench_multiturn_"))
    root.mkdir(parents=True, exist_ok=True)
    out = root / "run"
    argv = [sys.executable, "-m", "runtime.cli", "run", "--out", str(out), "--no-progress", "--steps", str(args.steps),
            "--set", f"run.seed={args.seed}", "--set", f"eval.every_steps={args.steps}",
            "--set", f'pretrain.cache_dir="{root / "warm"}"']
    for o in CONFIG:
        argv += ["--set", o]
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"rlx run exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    run_s = time.perf_counter() - start
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))

    sys.path.insert(0, str(ROOT))
    from ledger import events as ev
    from ledger import open_store
    from runtime.episodes import Calculator, PythonTool
    from runtime.episodes.check import check_rows
    from runtime.replay import replay_run

    with open_store(str(out), readonly=True) as store:
        completions = [s.event for s in store.read("run") if type(s.event) is ev.RolloutCompleted]
        rows = check_rows(store, "run")
    calls = [t["call"] for c in completions for t in c.turns if t["call"] is not None]

    def unavailable(self, arguments):
        raise RuntimeError("no tool may run in a replay")

    Calculator.run = unavailable  # type: ignore[method-assign]
    PythonTool.run = unavailable  # type: ignore[method-assign]
    report = replay_run(str(out))

    base, final = summary["eval_before"], summary["eval_after"]
    print(f"{len(completions)} episodes, {sum(len(c.turns) for c in completions) / len(completions):.2f} turns each, "
          f"{len(calls)} tool calls ({sum(c['status'] == 'ok' for c in calls)} ok); trained rows equal to the record: "
          f"{rows.equal}/{rows.rows}; replay without tools: {'bit-exact' if report.match else 'DIVERGES'} "
          f"({report.episodes_rederived} episodes re-derived); held-out pass {base:.1%} -> {final:.1%}")
    print(json.dumps({
        "episodes": len(completions),
        "turns_mean": round(sum(len(c.turns) for c in completions) / len(completions), 3),
        "tool_calls": len(calls),
        "tool_calls_ok": sum(c["status"] == "ok" for c in calls),
        "rows_checked": rows.rows,
        "rows_equal_recorded": rows.equal / rows.rows if rows.rows else 0.0,
        "replay_without_tools_exact": bool(report.match and report.final_digest == summary["final_digest"]),
        "episodes_rederived": report.episodes_rederived,
        "base_pass": base,
        "final_pass": final,
        "gain_pts": round(100 * (final - base), 2),
        "eval_problems": summary["eval_size"],
        "steps": args.steps,
        "seed": args.seed,
        "run_s": round(run_s, 1),
        "machine": summary.get("machine"),
    }, sort_keys=True))


if __name__ == "__main__":
    main()
