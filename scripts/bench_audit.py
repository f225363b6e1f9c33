#!/usr/bin/env python
"""``rlx audit`` queries on a demo-sized ledger (about a million events): time and peak memory.

The ledger is built through the controller's own event path with simulated workers (no JAX):
the demo's shape (groups of 8, 32 groups a batch, completions of 5 tokens, 1,800 steps,
max_staleness 1) gives 990,004 events, as many as ``scripts/demo`` writes. Each query runs as a
user runs it, ``rlx audit DIR version V`` (``rollout``, ``step``) in a fresh process, ``--repeat``
times; its wall time and peak resident memory (the child's own ``ru_maxrss``) are measured.
The baseline is the full fold every query used to make (verify and decode the whole run, then
index every event), run once in a fresh process; its answer must equal the query's.

Usage: python scripts/bench_audit.py [--steps 1800] [--repeat 3] [--no-baseline]
The last line of output is a JSON object (``query_s_1m_events``: the median time of the
``version`` query; ``peak_mib``: the largest peak of any query).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


_FULL_FOLD = """
import json, sys
from runtime.audit import Provenance
from runtime.audit.text import RunText
from runtime.replay import read_run
source = read_run(sys.argv[1])
source.chain.raise_if_bad()
prov = Provenance.from_events(source.events)
text = RunText(prov.run.config).prompt
print(json.dumps(prov.version(int(sys.argv[2]), prompt_text=text), sort_keys=True))
"""


def build(directory: str, steps: int) -> int:
    """A demo-shaped run of ``steps`` steps in ``directory/ledger.db``; its event count.

    Run in a child process of its own (``--build``): a query's process is forked from this one,
    and a fork's peak memory counts the parent's pages until it executes the query."""
    from ledger.sql import SqliteStore
    from runtime.config import load_config
    from runtime.controller import ControllerLoop
    from runtime.controller.simulation import run_to_end

    config = load_config(None, [f"run.steps={steps}", "sampling.group_size=8", "scheduling.groups_per_batch=32",
                                "sampling.max_tokens=5", "scheduling.max_staleness=1"], data_size=100_000)
    store = SqliteStore("sqlite:///" + os.path.join(directory, "ledger.db"), create=True, synchronous="OFF")
    loop = ControllerLoop.create(store, run_id="bench", config=config.to_dict(), config_digest=config.digest(),
                                 seed=config.run.seed)
    run_to_end(loop, workers=1, slots=256)
    events = store.head("bench").seq
    store.close()
    return events


def run_child(argv: list[str]) -> tuple[float, float, str]:
    """Wall seconds, peak resident MiB (the child's own, read by reaping it with ``wait4``) and
    stdout of ``argv`` run in a fresh process."""
    t = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode:
            raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {err.read().strip()[-400:]}")
        return seconds, usage.ru_maxrss / 1024, out.read()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1800)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-baseline", action="store_true", help="skip the full fold (about a minute)")
    ap.add_argument("--build", metavar="DIR", help=argparse.SUPPRESS)  # the child that writes the ledger
    args = ap.parse_args()
    if args.build:
        print(build(args.build, args.steps))
        return

    rlx = [sys.executable, "-m", "runtime.cli", "audit"]
    with tempfile.TemporaryDirectory(prefix="rlx-bench-audit-") as tmp:
        t = time.perf_counter()
        _, _, out = run_child([sys.executable, os.path.abspath(__file__), "--build", tmp, "--steps", str(args.steps)])
        events = int(out.split()[-1])
        size = sum(os.path.getsize(os.path.join(tmp, f)) for f in os.listdir(tmp))
        print(f"built {events} events ({size / 2**20:.0f} MiB) in {time.perf_counter() - t:.0f} s", file=sys.stderr)
        v = args.steps // 2
        rollout = (v - 1) * 256 + 5  # a rollout of batch v
        queries = {"version": ["version", str(v)], "version_last": ["version", str(args.steps)],
                   "rollout": ["rollout", str(rollout)], "step": ["step", str(v)]}
        seconds: dict[str, list[float]] = {name: [] for name in queries}
        peaks: dict[str, float] = {name: 0.0 for name in queries}
        for _ in range(args.repeat):
            for name, q in queries.items():
                s, peak, _ = run_child(rlx + [tmp, *q])
                seconds[name].append(s)
                peaks[name] = max(peaks[name], peak)
                print(f"{name}: {s:.2f} s, {peak:.0f} MiB", file=sys.stderr)
        _, _, answer = run_child(rlx + [tmp, "version", str(v), "--json"])
        _, _, table = run_child(rlx + [tmp, "version", str(v)])
        result: dict = {
            "events": events, "ledger_mib": round(size / 2**20, 1), "repeat": args.repeat,
            "query_s_1m_events": round(statistics.median(seconds["version"]), 2),
            "peak_mib": round(max(peaks.values()), 1),
            "median_s": {name: round(statistics.median(s), 2) for name, s in seconds.items()},
            "peak_mib_by_query": {name: round(p, 1) for name, p in peaks.items()},
            "version_table_lines": table.count("\n"),
        }
        if not args.no_baseline:
            s, peak, full = run_child([sys.executable, "-c", _FULL_FOLD, tmp, str(v)])
            assert json.loads(full) == json.loads(answer)["version"], "the query's answer is not the full fold's"
            result.update(full_fold_s=round(s, 2), full_fold_peak_mib=round(peak, 1),
                          speedup=round(s / result["query_s_1m_events"], 1),
                          memory_ratio=round(peak / result["peak_mib_by_query"]["version"], 1))
            print(f"full fold: {s:.2f} s, {peak:.0f} MiB (the same answer)", file=sys.stderr)
    result["targets_met"] = result["query_s_1m_events"] <= 10 and result["peak_mib"] <= 1024
    print(json.dumps(result))


if __name__ == "__main__":
    main()
