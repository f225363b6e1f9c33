"""The study scripts (``scripts/studies``) on a tiny model and budget: the staleness and alignment
studies end to end (each writes its figure and Markdown table and prints a last-line JSON with
one result per config), the algorithms study's refusal of an unknown algorithm."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.runtime.small_run import TINY

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("warm_start"))


def study(script: str, out: str, cache_dir: str, *extra: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, os.path.join(ROOT, "scripts", "studies", f"{script}.py"), "--steps", "2",
            "--eval-size", "8", "--out", out, *extra]
    for o in [*TINY, f'pretrain.cache_dir="{cache_dir}"']:
        argv += ["--set", o]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize(("script", "extra", "labels", "own"), [
    ("staleness", ["--staleness", "0", "1", "--modes", "deterministic"], ["deterministic-s0", "deterministic-s1"],
     "staleness_mean"),
    ("alignment", ["--dtypes", "float32"], ["float32-none", "float32-tis", "float32-exact"], "mismatch_max"),
])
def test_study_writes_its_figure_table_and_results(tmp_path, cache_dir, script, extra, labels, own):
    proc = study(script, str(tmp_path), cache_dir, *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["figure"] == str(tmp_path / f"{script}.png")
    assert result["table"] == str(tmp_path / f"{script}.md")
    with open(result["figure"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with open(result["table"], encoding="utf-8") as f:
        table = f.read()
    assert sorted(result["results"]) == sorted(labels)
    for label in labels:
        row = result["results"][label]
        assert 0.0 <= row["start_pass"] <= 1.0 and 0.0 <= row["final_pass"] <= 1.0
        assert row["steps_per_min"] > 0.0
        assert isinstance(row[own], float)
        assert f"| {label} |" in table
    assert "--steps 2" in table and "workers.mode=threads" in table
    if script == "alignment":  # the exact mode's trainer computes the engine's log-prob bits
        assert result["results"]["float32-exact"]["mismatch_max"] == 0.0
        assert result["results"]["float32-exact"]["mismatch_mean"] == 0.0


@pytest.mark.slow
def test_an_unknown_algorithm_is_refused_before_any_run(tmp_path):
    """The algorithms study shares the run, plot and table code that the two studies above run
    end to end; its own part is the choice of configs."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "studies", "algorithms.py"),
                           "--algorithms", "grpo", "nope", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "nope" in proc.stderr.strip().splitlines()[-1]
    assert not os.listdir(tmp_path)


def test_a_bad_option_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "studies", "staleness.py"), "--steps", "0",
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith("--steps 0: it must be >= 1")
    assert not os.listdir(tmp_path)
