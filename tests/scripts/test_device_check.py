"""``scripts/device_check`` end to end on the CPU (where it implies ``--small``): two 6-step demo
runs, their replay and layout, the engine against Hugging Face and a reduced 0.5B-shaped step, and
the last-line JSON with every key the check promises."""

from __future__ import annotations

import json
import numbers
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEYS = ("backend", "devices", "layout", "demo_steps_per_min", "demo_gain_pts", "digest_match", "replay_exact",
        "engine_vs_hf", "step_s_05b", "peak_gib_05b")


@pytest.mark.slow
def test_device_check_on_the_cpu_runs_every_part_and_ends_on_one_json_line(tmp_path):
    pytest.importorskip("transformers")
    done = subprocess.run([os.path.join(ROOT, "scripts", "device_check"), "--out", str(tmp_path), "--steps", "6"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(KEYS) <= set(result)
    assert result["errors"] == {} and result["ok"] is True
    assert result["backend"] == "cpu" and result["small"] is True and result["devices"] >= 1
    assert result["digest_match"] is True and result["replay_exact"] is True
    assert result["digest_1"] == result["digest_2"]
    assert isinstance(result["layout"], dict) and result["layout"]
    for key in ("demo_steps_per_min", "engine_vs_hf", "step_s_05b", "peak_gib_05b"):
        assert isinstance(result[key], numbers.Real) and result[key] > 0, key
    assert isinstance(result["demo_gain_pts"], numbers.Real)
    assert result["peak_source_05b"] == "xla memory analysis"  # the CPU keeps no peak count
    assert result["shape_05b"]["num_layers"] == 2 and result["replay_versions"] == result["demo_steps"] + 1
    assert os.path.dirname(result["work"]) == str(tmp_path)
