"""``scripts/bench_controller.py`` runs against the controller as it is (a small workload) and
reports what the README quotes from it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_controller.py"


def test_a_small_workload_runs_and_counts_its_work():
    spec = importlib.util.spec_from_file_location("bench_controller", SCRIPT)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    report = bench.main(["--steps", "2", "--workers", "8", "--batch", "64", "--group-size", "8", "--tokens", "16"])
    assert report["completions"] == 2 * 64  # two batches of 64 completions
    for key in ("completions_per_s", "decisions_per_s", "replay_eps", "fold_eps"):
        assert report[key] > 0
