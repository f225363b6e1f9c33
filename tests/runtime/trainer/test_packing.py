"""``trainer.pack``: several sequences to a row of the train step, each attending only within
itself, with the per-token values of the padded step up to float rounding."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.algorithms import configure
from runtime.config import ConfigError, load_config
from runtime.model import ModelConfig, forward, init_params
from runtime.trainer import Sample, StepConfig, make_optimizer, pack, pack_bins, score, train_step
from tests.runtime.small_run import TINY
from tests.runtime.trainer import reference

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
MODEL = ModelConfig(vocab_size=29, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=48,
                    initializer_range=0.3)
WIDTH = 24


def _samples(seed: int = 0, groups: int = 4, group_size: int = 4) -> list[Sample]:
    """Groups of one prompt each, prompts of 2–9 tokens and completions of 1–12 (log-normal-ish)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(groups):
        prompt = np.int32([1, *rng.integers(3, 29, int(rng.integers(1, 9)))])
        for _ in range(group_size):
            c = int(min(12, max(1, round(rng.lognormal(1.2, 0.7)))))
            out.append(Sample(prompt, np.int32(rng.integers(3, 29, c)), np.float32(-rng.random(c)),
                              float(rng.random() < 0.5), 0))
    return out


def test_pack_bins_places_every_sequence_once_first_fit_by_decreasing_length():
    samples = _samples()
    padded = pack(samples, group_size=4, width=WIDTH, pad_id=0)
    packed = pack_bins(samples, group_size=4, width=WIDTH, pad_id=0, multiple=2)
    lengths = [len(s.prompt) + len(s.completion) for s in samples]
    N = packed.tokens_BT.shape[0]
    assert N % 2 == 0 and N < len(samples) and N >= -(-sum(lengths) // WIDTH)
    assert packed.attention_BT.dtype == np.int32 and int((packed.attention_BT > 0).sum()) == sum(lengths)
    # each sample's targets, read where rows_BS says, are its own tokens
    targets = packed.tokens_BT[:, 1:].reshape(-1)
    for b, L in enumerate(lengths):
        assert np.array_equal(targets[packed.rows_BS[b, : L - 1]], padded.tokens_BT[b, 1:L])
    for name in ("mask_BS", "behaviour_BS", "rewards_MG", "versions_B"):  # by sample, as padded
        assert np.array_equal(getattr(packed, name), getattr(padded, name))
    again = pack_bins(samples, group_size=4, width=WIDTH, pad_id=0, multiple=2)
    assert again.digest() == packed.digest() != padded.digest()  # a pure function of the samples
    assert padded.rows_BS is None


def test_packed_log_probs_are_the_padded_ones_and_the_numpy_references():
    samples = _samples(1)
    params = init_params(MODEL, key=jax.random.key(0))
    config = StepConfig(model=MODEL, objective=configure("grpo"), temperature=0.7)
    padded = pack(samples, group_size=4, width=WIDTH, pad_id=0)
    packed = pack_bins(samples, group_size=4, width=WIDTH, pad_id=0)
    want = np.asarray(score(params, padded.tokens_BT, padded.attention_BT, config=config))
    got = np.asarray(score(params, packed.tokens_BT, packed.attention_BT, packed.mask_BS, packed.rows_BS,
                           config=config))
    logits = np.asarray(forward(params, jnp.asarray(padded.tokens_BT), jnp.asarray(padded.attention_BT), config=MODEL))
    ref, _ = reference.token_logprobs(logits, padded.tokens_BT, 0.7)
    mask = padded.mask_BS
    assert np.allclose(got[mask], want[mask], rtol=2e-6, atol=1e-6)  # float32 rounding of other shapes
    assert np.allclose(got[mask], ref[mask], rtol=1e-5, atol=1e-5)
    assert np.all(got[~mask] == 0.0)


@pytest.mark.parametrize("bounds", [{}, {"micro_batch_size": 2, "logits_chunk": 5, "remat": True}],
                         ids=["whole", "bounded"])
def test_a_packed_step_gives_the_padded_steps_loss_and_update(bounds):
    samples = _samples(2)
    params = init_params(MODEL, key=jax.random.key(1))
    config = StepConfig(model=MODEL, objective=configure("grpo"), learning_rate=1e-2, **bounds)
    padded = pack(samples, group_size=4, width=WIDTH, pad_id=0)
    packed = pack_bins(samples, group_size=4, width=WIDTH, pad_id=0, multiple=2)
    zeros = jnp.zeros(padded.mask_BS.shape, jnp.float32)
    current = jnp.ones((len(samples),), bool)

    def step(batch, cfg):
        p = jax.tree.map(jnp.array, params)
        new, _, metrics = train_step(p, make_optimizer(cfg).init(p), jax.device_put(batch), zeros, zeros, current,
                                     config=cfg)
        return jax.tree.leaves(new), {k: float(v) for k, v in metrics.items()}

    base, base_metrics = step(padded, config)
    new, metrics = step(packed, dataclasses.replace(config, pack=True))
    for key in ("loss", "grad_norm", "entropy", "response_tokens"):
        assert metrics[key] == pytest.approx(base_metrics[key], rel=1e-5, abs=1e-6), key
    moved = max(float(np.max(np.abs(np.float64(a) - np.float64(b)))) for a, b in zip(base, jax.tree.leaves(params), strict=True))
    assert max(float(np.max(np.abs(np.float64(a) - np.float64(b)))) for a, b in zip(new, base, strict=True)) < 1e-2 * moved


def test_packing_is_a_recorded_option_that_replaces_the_padded_rows_work_savers():
    config = load_config(None, ["trainer.pack=true"])
    assert config.trainer.pack and not config.trainer.shared_prefix and not config.trainer.completion_logits
    assert load_config(None, []).trainer.pack is False  # and a run logged before it existed reads as false
    for overrides, words in ((["trainer.pack=true", "trainer.shared_prefix=true"], "padded rows"),
                             (["trainer.pack=true", "trainer.mesh={fsdp=2}", "trainer.deterministic_reduction=true"],
                              "fixed-order reduction")):
        with pytest.raises(ConfigError) as e:
            load_config(None, overrides)
        assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow
def test_a_run_with_packing_a_small_pool_and_shared_prefills_replays_bit_exactly_with_regenerate(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = str(tmp_path / "run")
    argv = [sys.executable, "-m", "runtime.cli", "run", "--out", out, "--steps", "3", "--no-progress"]
    for o in [*TINY, "trainer.pack=true", "workers.page_size=4", "inference.kv_pages=8", "eval.every_steps=0",
              f'pretrain.cache_dir="{tmp_path / "warm"}"']:
        argv += ["--set", o]
    run = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    replay = subprocess.run([sys.executable, "-m", "runtime.cli", "replay", out, "--regenerate", "--json"], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=600)
    assert replay.returncode == 0, replay.stderr[-3000:]
    report = json.loads(replay.stdout.strip().splitlines()[-1])
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        final = json.load(f)["final_digest"]
    assert report["match"] and report["final_digest"] == final and report["rollouts_regenerated"] > 0
