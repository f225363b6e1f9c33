"""Exact log-probs (``trainer.exact_logprobs``): the train step's log-prob of every sampled token is
the engine's, bit for bit.

The bits are compared in a child process compiled without fused multiply-adds
(``runtime.numerics``), over random engines (slots, page sizes, prefill rows, pools small enough to
preempt, continuous or static batching), prompt groups of random lengths and temperatures, padded
and packed train batches, in float32 and bfloat16 (``tests/runtime/exact_probe.py``); the same probe
without the flag is the control that shows the comparison can fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from runtime.config import ConfigError, load_config
from runtime.errors import UsageError
from runtime.numerics import NO_FMA_FLAG, check_exact_backend, exact_env, exact_flags_set, min_rows, padded_rows
from runtime.trainer import Sample
from runtime.trainer.batch import pack_bins

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _probe(seed: int, cases: int, dtype: str, *, exact: bool = True) -> list[dict]:
    env = dict(os.environ)
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_cpu_max_isa="))
    if exact:
        env = exact_env(env)
    argv = [sys.executable, "-m", "tests.runtime.exact_probe", str(seed), str(cases), dtype]
    done = subprocess.run(argv + ([] if exact else ["unchecked"]), cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["cases"]


@pytest.mark.slow
@pytest.mark.parametrize("dtype,seed", [("float32", 2), ("bfloat16", 1)])
def test_the_train_step_gives_the_engines_log_prob_bits(dtype, seed):
    cases = _probe(seed, 4, dtype)
    for c in cases:
        assert c["step_mismatch_max"] == 0.0, c  # the train step's own forward pass: what a run checks
        # The forward-only scoring program (score: a reference model's log-probs, the divergence
        # message) on padded, packed and shared-prefix rows.
        assert c["differ"] == {"padded": 0, "packed": 0, "shared": 0}, c
    assert sum(c["tokens"] for c in cases) > 150
    assert any(c["preemptions"] for c in cases)  # recomputed after preemption, the same bits


@pytest.mark.slow
def test_without_the_flag_the_bits_differ():
    cases = _probe(0, 2, "float32", exact=False)
    assert sum(c["differ"]["padded"] for c in cases) > 0


def test_the_flag_is_added_once_and_replaces_another_isa_cap():
    env = exact_env({"XLA_FLAGS": "--xla_force_host_platform_device_count=2 --xla_cpu_max_isa=AVX512"})
    assert env["XLA_FLAGS"].split() == ["--xla_force_host_platform_device_count=2", NO_FMA_FLAG]
    assert exact_env(env) == env and exact_flags_set(env)
    assert exact_env({})["XLA_FLAGS"] == NO_FMA_FLAG and not exact_flags_set({})


def test_a_process_without_the_flag_is_refused_in_one_line():
    assert not exact_flags_set()  # the test process compiles as every other run does
    with pytest.raises(UsageError) as e:
        check_exact_backend()
    assert NO_FMA_FLAG in str(e.value) and "\n" not in str(e.value)


def test_calls_are_padded_to_enough_rows():
    assert min_rows(576, 49152) == 64  # SmolLM2: a matmul's regime decides
    assert min_rows(32, 53) == 256  # a tiny model: its norm's 32 columns need 256 rows for 8,192 elements
    assert padded_rows(3, least=64) == 64 and padded_rows(100, least=64) == 100
    assert padded_rows(2, 31, least=64) == 3


def test_the_config_resolves_and_refuses():
    config = load_config(None, ["trainer.exact_logprobs=true", "model.dtype=bfloat16"]).resolved()
    assert config.trainer.old_logprobs == "behaviour"  # exact in bfloat16 too: no recompute pass
    assert config.workers.attention == "ordered"
    assert config.trainer.shared_prefix is True and config.trainer.completion_logits is True  # they keep the bits
    for overrides, names in (
        (["trainer.mesh={model=2}"], "trainer.exact_logprobs"),
        (["inference.mesh={model=2}"], "inference.mesh"),
        (["workers.attention=live"], "workers.attention"),
    ):
        with pytest.raises(ConfigError) as e:
            load_config(None, ["trainer.exact_logprobs=true", *overrides])
        assert names in str(e.value) and "\n" not in str(e.value)


def test_packed_sequences_start_on_page_boundaries():
    gen = np.random.default_rng(0)
    samples = [Sample(gen.integers(3, 50, int(n)).astype(np.int32), gen.integers(3, 50, 3).astype(np.int32),
                      np.zeros(3, np.float32), 0.0, 0) for n in (5, 2, 9, 1, 6, 3)]
    batch = pack_bins(samples, group_size=2, width=32, pad_id=0, align=8)
    segments = np.asarray(batch.attention_BT)
    starts = [t for row in segments for t in range(32) if row[t] > 0 and (t == 0 or row[t - 1] != row[t])]
    assert len(starts) == 6 and all(t % 8 == 0 for t in starts)
    packed = pack_bins(samples, group_size=2, width=32, pad_id=0)
    assert int((np.asarray(packed.attention_BT) > 0).sum()) == int((segments > 0).sum())


@pytest.mark.slow
@pytest.mark.parametrize("dtype,mode,extra", [
    ("float32", "processes", []),
    ("bfloat16", "threads", []),
    # packed rows, a KV pool small enough to preempt, pages of 4 (prompts shared, as by default)
    ("float32", "threads", ["trainer.pack=true", "workers.page_size=4", "inference.kv_pages=8"]),
])
def test_a_run_in_the_mode_measures_no_mismatch_on_any_step(tmp_path, dtype, mode, extra):
    from tests.runtime.small_run import TINY

    out = tmp_path / "run"
    sets = [*TINY, "trainer.exact_logprobs=true", f"model.dtype={dtype}", f"workers.mode={mode}",
            f"pretrain.cache_dir={tmp_path / 'cache'}", *extra]
    argv = [sys.executable, "-m", "runtime.cli", "run", "--steps", "2", "--out", str(out), "--no-progress"]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # rlx run adds the flag itself
    done = subprocess.run(argv + [a for s in sets for a in ("--set", s)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    with open(out / "summary.json", encoding="utf-8") as f:
        summary = json.load(f)
    assert [m["logprob_mismatch_max"] for m in summary["metrics"]] == [0.0, 0.0]
    assert summary["logprob_mismatch_max_run"] == 0.0
