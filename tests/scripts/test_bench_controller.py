"""``scripts/bench_controller.py`` runs against the controller as it is (a small workload) and
reports what the README quotes from it."""

from __future__ import annotations

from tests.scripts.script_module import load_script


def test_a_small_workload_runs_and_counts_its_work():
    bench = load_script("bench_controller")
    report = bench.main(["--steps", "2", "--workers", "8", "--batch", "64", "--group-size", "8", "--tokens", "16"])
    assert report["completions"] == 2 * 64  # two batches of 64 completions
    for key in ("completions_per_s", "decisions_per_s", "replay_eps", "fold_eps"):
        assert report[key] > 0
