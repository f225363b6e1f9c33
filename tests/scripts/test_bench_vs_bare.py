"""scripts/bench_vs_bare.py: its one-line refusals, and one tiny run end to end against a stand-in
bare loop (two scripts that answer like warm_a.py and grpo_a.py without training anything)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.runtime.small_run import TINY
from tests.scripts.script_module import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "bench_vs_bare.py")

WARM = """\
import argparse
ap = argparse.ArgumentParser()
ap.add_argument("--task"); ap.add_argument("--out"); ap.add_argument("--eval_every", type=int)
args = ap.parse_args()
open(args.out, "wb").write(b"weights")
print("saved", args.out)
"""

GRPO = """\
import argparse, json, os
ap = argparse.ArgumentParser()
ap.add_argument("--init"); ap.add_argument("--lr", type=float); ap.add_argument("--minutes", type=float)
ap.add_argument("--out")
args = ap.parse_args()
assert os.path.isfile(args.init), args.init
wall = 60 * args.minutes
curve = [dict(t=0.0, step=0, pass_=0.3), dict(t=wall, step=12, pass_=0.5)]
summary = dict(steps=12, wall_s=wall, steps_per_min=12 / wall * 60, samp_s_per_step=0.1, train_s_per_step=0.05,
               start_pass=0.3, final_pass=0.5, gain_pts=20.0, best_pass=0.5)
print(json.dumps(summary))
json.dump(dict(summary, curve=curve), open(args.out, "w"))
"""


def bench(*args: str, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def bare(tmp_path):
    folder = tmp_path / "bare"
    folder.mkdir()
    (folder / "warm_a.py").write_text(WARM)
    (folder / "grpo_a.py").write_text(GRPO)
    return folder


@pytest.mark.parametrize(("args", "named"), [
    (["--bare", "/nonexistent/bare_grpo"], "/nonexistent/bare_grpo"),
    (["--repeats", "0"], "--repeats 0"),
])
def test_bad_input_is_one_line_and_runs_nothing(tmp_path, bare, args, named):
    keep = tmp_path / "runs"
    proc = bench("--bare", str(bare), "--keep", str(keep), *args, timeout=30)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], proc.stderr
    assert not keep.exists()


def test_a_failing_run_is_one_line_naming_the_command(bare):
    proc = bench("--bare", str(bare), "--set", "model.no_such_field=1", timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("$ ")]
    assert len(lines) == 1, proc.stderr
    assert "runtime.cli run" in lines[0] and "no_such_field" in lines[0]


class Base:
    def inherited(self):
        time.sleep(0.01)
        return "base"


class Loop(Base):
    def outer(self):
        time.sleep(0.01)
        self.inherited()
        return self.inner()

    def inner(self):
        time.sleep(0.02)
        return "inner"


def test_clock_counts_nested_calls_once_and_restores_what_it_wrapped():
    clock = load_script("bench_vs_bare").Clock()
    originals = {name: vars(Loop)[name] for name in ("outer", "inner")}
    clock.wrap(Loop, "outer", "loop")
    clock.wrap(Loop, "inner", "loop")
    clock.wrap(Loop, "inherited", "base")  # Base's method: restored by deleting Loop's attribute
    assert Loop().outer() == "inner"
    assert clock.calls == {"loop": 1, "base": 1}  # inner ran inside outer: counted once
    assert clock.seconds["loop"] >= 0.04 and clock.within[("loop", "base")] == clock.seconds["base"] >= 0.01
    clock.restore()
    assert {name: vars(Loop)[name] for name in ("outer", "inner")} == originals
    assert "inherited" not in vars(Loop)
    assert Loop().outer() == "inner" and clock.calls == {"loop": 1, "base": 1}


@pytest.mark.slow
def test_tiny_run_end_to_end(tmp_path, bare):
    argv = ["--bare", str(bare), "--steps", "2", "--profile-steps", "2", "--keep", str(tmp_path / "runs")]
    for o in [*TINY, "eval.size=8", f'pretrain.cache_dir="{tmp_path / "warm_start"}"']:
        argv += ["--set", o]
    proc = bench(*argv, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("rlx_steps_per_min", "bare_steps_per_min", "ratio", "rlx_start_pass", "rlx_final_pass",
                "rlx_gain_pts", "bare_start_pass", "bare_final_pass", "bare_gain_pts", "rl_seconds", "rlx_steps",
                "bare_steps", "bare_sample_s_per_step", "bare_train_s_per_step", "rlx_time_per_step", "rlx_curve",
                "bare_curve", "cores", "repeats", "rlx_steps_per_min_range", "bare_steps_per_min_range", "ratio_range"):
        assert key in result, key
    assert result["ratio"] == pytest.approx(result["rlx_steps_per_min"] / result["bare_steps_per_min"], rel=1e-12)
    assert result["ratio_range"] == [result["ratio"], result["ratio"]]
    assert result["rlx_steps"] == 2 and result["repeats"] == 1
    assert result["rlx_gain_pts"] == pytest.approx(100 * (result["rlx_final_pass"] - result["rlx_start_pass"]))
    # The bare loop ran for the rlx run's RL time (the stand-in reports what it was given).
    assert result["bare_curve"][-1][1] == pytest.approx(result["rl_seconds"], abs=0.01)
    assert result["bare_curve"][0] == [0, 0.0, 0.3]
    assert result["rlx_curve"] and all(len(point) == 3 for point in result["rlx_curve"])
    times = result["rlx_time_per_step"]
    for key in ("sampling", "scoring", "training", "trainer_other", "publishing", "controller", "trainer_waiting"):
        assert isinstance(times[key], float), key
    assert times["sampling"] > 0 and times["training"] > 0 and times["controller"] > 0
    assert times["steps"] == 2
