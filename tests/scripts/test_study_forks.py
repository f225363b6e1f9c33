"""The fork-based paired study (``scripts/studies/forks.py``): its statistics against hand values,
its refusals in one line, and its smallest version end to end on a tiny model (two seeds, a fork
that changes nothing and one with another learning rate)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.runtime.small_run import TINY

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "studies", "forks.py")
sys.path.insert(0, os.path.join(ROOT, "scripts", "studies"))

import forks  # noqa: E402 - scripts/studies is not a package


@pytest.mark.parametrize(("df", "expected"), [(1, 12.7062), (2, 4.3027), (4, 2.7764), (30, 2.0423)])
def test_t_quantile_matches_the_table(df, expected):
    assert forks.t_quantile(0.975, df) == pytest.approx(expected, abs=1e-3)


def test_paired_and_welch_intervals():
    # differences 0.1, 0.2, 0.3: mean 0.2, s² = 0.01, var of the mean 0.01/3, half-width t(0.975, 2)·√(0.01/3)
    p = forks.paired([0.1, 0.2, 0.3])
    assert p["diff"] == pytest.approx(0.2) and p["var"] == pytest.approx(0.01 / 3)
    assert p["ci"][1] - p["diff"] == pytest.approx(4.3027 * math.sqrt(0.01 / 3), rel=1e-4)
    assert forks.paired([0.0, 0.0, 0.0]) == {"diff": 0.0, "var": 0.0, "ci": [0.0, 0.0]}
    # a = 0.1, 0.2, 0.3 (s² 0.01), b = 0, 0, 0.3 (s² 0.03): var 0.01/3 + 0.03/3; Welch df = var² / (va²/2 + vb²/2)
    w = forks.independent([0.1, 0.2, 0.3], [0.0, 0.0, 0.3])
    assert w["diff"] == pytest.approx(0.1) and w["var"] == pytest.approx(0.04 / 3)
    df = (0.04 / 3) ** 2 / ((0.01 / 3) ** 2 / 2 + (0.03 / 3) ** 2 / 2)  # 3.2
    assert w["ci"][1] - w["diff"] == pytest.approx(forks.t_quantile(0.975, df) * math.sqrt(0.04 / 3))
    assert forks.ratio(1.0, 0.0) is None and forks.ratio(3.0, 1.5) == 2.0


@pytest.mark.parametrize(("extra", "message"), [
    (["--seeds", "0"], "--seeds 0: an interval needs at least 2 different seeds"),
    (["--steps", "4", "--at", "4"], "--at 4: it must be >= 0 and < --steps (4)"),
    (["--setting", "seed", "run.seed=3"], "--setting seed run.seed=3: a fork may change only"),
])
def test_a_bad_option_is_one_line_and_runs_nothing(tmp_path, extra, message):
    proc = subprocess.run([sys.executable, SCRIPT, "--out", str(tmp_path), *extra], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr.strip().splitlines()[-1]
    assert not os.listdir(tmp_path)


@pytest.mark.slow
def test_the_smallest_study_pairs_forks_and_independent_seeds(tmp_path):
    """3 steps forked at version 2 with another learning rate, seeds 0 and 1; a warm start of 200
    steps on two-digit sums so that pass rates are not all 0. (A fork that changes nothing ends on
    its parent's weights: tests/runtime/test_fork.py.)"""
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                            for a in range(10) for b in range(10)), encoding="utf-8")
    argv = [sys.executable, SCRIPT, "--steps", "3", "--at", "2", "--seeds", "0", "1", "--eval-size", "20",
            "--out", str(tmp_path / "out"), "--setting", "lr", "trainer.learning_rate=3e-2"]
    for o in [*TINY, "pretrain.steps=200", "pretrain.batch_size=32", "trainer.learning_rate=1e-2",
              "sampling.max_tokens=4", "data.task=jsonl", f'data.path="{data}"', "data.eval_fraction=0.2",
              f'pretrain.cache_dir="{tmp_path / "warm"}"']:
        argv += ["--set", o]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (result["steps"], result["at"], result["seeds"]) == (3, 2, [0, 1])
    assert sorted(result["results"]) == ["lr"]
    with open(result["table"], encoding="utf-8") as f:
        table = f.read()
    with open(result["figure"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    for label, r in result["results"].items():
        for key in ("parent_pass", "fork_pass", "independent_pass"):
            assert len(r[key]) == 2 and all(0.0 <= v <= 1.0 for v in r[key])
        for arm in ("paired", "independent"):
            lo, hi = r[f"{arm}_ci"]
            assert lo <= r[f"{arm}_diff"] <= hi and -1.0 <= r[f"{arm}_diff"] <= 1.0 and r[f"{arm}_var"] >= 0.0
        assert r["wall_ratio"] > 0.0 and r["fork_arm_s"] > 0.0 and r["independent_arm_s"] > 0.0
        assert f"| {label} |" in table
    lr = result["results"]["lr"]
    assert lr["same_final_digest"] == [False, False]  # another learning rate from version 2 on moves the weights
    assert lr["paired_diff"] == pytest.approx(sum(f - p for f, p in zip(lr["fork_pass"], lr["parent_pass"], strict=True)) / 2)
    assert max(lr["parent_pass"]) > 0.0  # the warm start answers some held-out sums
    assert "rlx fork PARENT --at 2" in table
