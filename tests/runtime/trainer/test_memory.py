"""The memory-bounded train step: micro-batches, chunked log-probs and remat change no result.

Every objective of the registry runs on the ragged batch of ``test_step`` (mixed on- and
off-policy rows, a reference model for the KL and preference terms) once as one whole batch and
once in micro-batches with chunked log-probs and rematerialised layers; the loss, every metric and
the update must agree to float32 rounding. The same configuration twice must give the same bits.

Every step of these checks is one call of ``train_step`` inside a single compiled program
(``_steps``): compiled one by one, the ~30 small steps took minutes with a cold compilation cache,
most of it a fixed cost per compilation.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from kernels.algorithms import ALGORITHMS, configure
from runtime.config import Config, ConfigError
from runtime.errors import UsageError
from runtime.model import ModelConfig, init_params, transformer
from runtime.trainer import StepConfig, make_optimizer, score, train_step
from runtime.trainer import optimizer as optimizer_module
from tests.runtime.trainer.test_step import DELTAS, MODEL, TEMPERATURE, WIDTH, G, _batch, _params

# One AdamW step from a fresh state with eps = 1 moves a parameter by -g/(|g| + 1) (test_step):
# the update keeps the size of the gradient, so comparing parameters compares gradients.
LR, ADAM_EPS, NO_CLIP = 1.0, 1.0, 1e9
CURRENT_B = np.array([True, False, False, True, False, True])
# Micro-batches of 2 rows, chunks of 3 positions (7 = 3 + 3 + 1: a ragged last chunk).
BOUNDED: dict[str, Any] = dict(micro_batch_size=2, logits_chunk=3, remat=True)
# Each setting alone (or the two whole-batch ones together), GRPO's step against the whole batch.
SETTINGS: dict[str, dict[str, Any]] = {
    "micro1_chunk4": dict(micro_batch_size=1, logits_chunk=4),  # 1-row micro-batches, 7 = 4 + 3
    "micro3": dict(micro_batch_size=3),  # micro-batches alone: no chunks, no remat
    "chunk2_remat": dict(logits_chunk=2, remat=True),  # whole batch: one pass through the chunks
    "micro6": dict(micro_batch_size=6),  # the whole batch: the one-pass step
}
TIED = MODEL.replace(tie_word_embeddings=True)
BF16 = MODEL.replace(dtype="bfloat16")
# A micro-batch's log-probs come from matmuls of other shapes than the whole batch's, so each
# differs in its last bits (float32 spacing at |ℓ| ≈ 10 is 9.5e-7); losses and metrics are sums of
# ~20 such terms and the gradient a sum of 3 micro-batch gradients in another order. Measured
# worst case over all objectives: 1.4e-6 on an update of size ≤ 1 (RLOO, ‖g‖ ≈ 32) and 1e-5
# relative on a metric (kl_ref, a sum of exponentials of log-ratios).
UPDATE_TOL = 1e-5
METRIC_RTOL, METRIC_ATOL = 3e-5, 2e-6


def _objective(name: str):
    """The registry's ``name`` with the batch's group size and maximum length where it has them."""
    known = {f.name for f in dataclasses.fields(ALGORITHMS[name])}
    options = {k: v for k, v in (("group_size", G), ("max_length", WIDTH - 1)) if k in known}
    return configure(name, **options)


def _inputs(batch):
    """Old log-probs ``ℓ_old = -1 + δ`` and reference log-probs on completion tokens (0 elsewhere)."""
    mask_BS = np.asarray(batch.mask_BS)
    noise_BS = np.random.default_rng(0).standard_normal(mask_BS.shape)
    old_BS = np.where(mask_BS, -1.0 + np.resize(DELTAS, mask_BS.shape), 0.0)
    ref_BS = np.where(mask_BS, -1.2 + 0.3 * noise_BS, 0.0)
    return jnp.float32(old_BS), jnp.float32(ref_BS)


def _config(name: str, model: ModelConfig = MODEL, **memory) -> StepConfig:
    return StepConfig(
        model=model, objective=_objective(name), learning_rate=LR, adam_eps=ADAM_EPS,
        max_grad_norm=NO_CLIP, temperature=TEMPERATURE, **memory,
    )


# Every step the checks compare: key -> (configuration, with the tied model's parameters).
STEPS: dict[str, tuple[StepConfig, bool]] = {
    **{f"whole/{n}": (_config(n), False) for n in ALGORITHMS},
    **{f"bounded/{n}": (_config(n, **BOUNDED), False) for n in ALGORITHMS},
    **{f"grpo/{s}": (_config("grpo", **m), False) for s, m in SETTINGS.items()},
    "bf16/bounded": (_config("grpo", BF16, **BOUNDED), False),
    "tied/whole": (_config("grpo", TIED), True),
    "tied/bounded": (_config("grpo", TIED, **BOUNDED), True),
}
SCORE_PLAIN = StepConfig(model=MODEL, objective=configure("grpo"), temperature=TEMPERATURE)
SCORE_BOUNDED = dataclasses.replace(SCORE_PLAIN, **BOUNDED)


@functools.partial(jax.jit, static_argnames=("steps",))
def _steps(params, tied_params, batch, old_BS, ref_BS, current_B, *, steps):
    """``(params, opt_state, metrics)`` of every step in ``steps``, and both scores, by key."""
    out = {}
    for key, (config, tied) in steps:
        p = tied_params if tied else params
        opt_state = make_optimizer(config).init(p)
        out[key] = train_step(p, opt_state, batch, old_BS, ref_BS, current_B, config=config)
    for key, config in (("score/plain", SCORE_PLAIN), ("score/bounded", SCORE_BOUNDED)):
        out[key] = score(params, batch.tokens_BT, batch.attention_BT, config=config)
    return out


def _run() -> dict:
    batch = _batch()
    old_BS, ref_BS = _inputs(batch)
    return _steps(_params(), init_params(TIED, key=jax.random.key(3)), jax.device_put(batch),
                  old_BS, ref_BS, jnp.asarray(CURRENT_B), steps=tuple(STEPS.items()))


@functools.cache
def _results() -> dict:
    return _run()


def _assert_equivalent(whole, bounded):
    (p0, _, m0), (p1, _, m1) = whole, bounded
    assert m0.keys() == m1.keys()
    for k in m0:
        assert float(m1[k]) == pytest.approx(float(m0[k]), rel=METRIC_RTOL, abs=METRIC_ATOL), k
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(p0), jax.tree.leaves(p1), strict=True):
        assert b.dtype == a.dtype
        np.testing.assert_allclose(b, a, rtol=0, atol=UPDATE_TOL, err_msg=jax.tree_util.keystr(path))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_micro_batches_give_the_whole_batch_loss_and_gradient(name):
    whole = _results()[f"whole/{name}"]
    assert float(whole[2]["grad_norm"]) > 0.1  # the batch carries signal for every objective
    _assert_equivalent(whole, _results()[f"bounded/{name}"])


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_every_setting_alone_keeps_the_result(setting):
    _assert_equivalent(_results()["whole/grpo"], _results()[f"grpo/{setting}"])


def test_the_same_configuration_gives_the_same_bits():
    first, second = _results(), _run()
    assert first.keys() == second.keys()
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second), strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_a_whole_batch_micro_batch_size_is_the_plain_step_bit_for_bit():
    """``micro_batch_size`` = the batch traces the plain step itself: the same program."""
    batch = jax.device_put(_batch())
    old_BS, ref_BS = _inputs(batch)
    params = _params()

    def program(config):
        opt_state = make_optimizer(config).init(params)
        return train_step.lower(params, opt_state, batch, old_BS, ref_BS, jnp.asarray(CURRENT_B),
                                config=config).as_text()

    assert program(_config("grpo", micro_batch_size=6)) == program(_config("grpo"))
    assert program(_config("grpo", micro_batch_size=3)) != program(_config("grpo"))
    plain, whole = _results()["whole/grpo"], _results()["grpo/micro6"]
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(whole), strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_score_in_micro_batches_and_chunks_is_the_plain_score():
    mask_BS = np.asarray(_batch().mask_BS)
    want_BS, got_BS = np.asarray(_results()["score/plain"]), np.asarray(_results()["score/bounded"])
    np.testing.assert_allclose(got_BS[mask_BS], want_BS[mask_BS], rtol=0, atol=5e-6)


def test_a_micro_batch_size_that_does_not_divide_the_batch_is_refused():
    config = StepConfig(model=MODEL, objective=_objective("grpo"), micro_batch_size=4)
    with pytest.raises(UsageError, match=r"micro_batch_size=4 does not divide the batch of 6 rows"):
        config.micro_batches(6)
    with pytest.raises(ConfigError, match=r"trainer.micro_batch_size: 12 .* divide the batch of 16 rows"):
        Config.from_dict({"trainer": {"micro_batch_size": 12},
                          "scheduling": {"groups_per_batch": 2}, "sampling": {"group_size": 8}})
    with pytest.raises(ConfigError, match=r"model.dtype: 'float16' .* accepted: float32, bfloat16"):
        Config.from_dict({"model": {"dtype": "float16"}})


def test_bfloat16_compute_keeps_float32_master_weights_and_optimizer_state():
    """bfloat16 matmuls, float32 everything that persists: the step takes and returns float32
    parameters and Adam moments, and its loss is the float32 step's to bfloat16 accuracy."""
    new_params, opt_state, metrics = _results()["bf16/bounded"]
    for leaf in jax.tree.leaves((new_params, opt_state)):
        assert leaf.dtype in (jnp.float32, jnp.int32), leaf.dtype
    moved = max(float(jnp.max(jnp.abs(a - b))) for a, b in
                zip(jax.tree.leaves(new_params), jax.tree.leaves(_params()), strict=True))
    assert moved > 0.1
    _, _, want = _results()["whole/grpo"]
    # bfloat16 keeps 8 bits of mantissa: log-probs of size ~10 move by ~0.05, the loss (a mean
    # of ratio-weighted advantages of size ~1) by a few hundredths.
    assert float(metrics["loss"]) == pytest.approx(float(want["loss"]), abs=0.05)
    assert float(metrics["entropy"]) == pytest.approx(float(want["entropy"]), rel=0.02)
    assert float(metrics["loss"]) != float(want["loss"])  # it did compute in bfloat16


@pytest.mark.slow
def test_micro_batches_bound_the_step_memory():
    """XLA's own accounting of the compiled step: its temporary memory with micro-batches does
    not grow with the batch, while the one-pass step holds the whole batch's logits."""
    model = ModelConfig(vocab_size=4096, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                        intermediate_size=64)
    params = init_params(model, key=jax.random.key(0))

    def temp_bytes(rows: int, **memory) -> int:
        config = StepConfig(model=model, objective=configure("grpo", group_size=4), **memory)
        batch = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct((rows,) + x.shape[1:], x.dtype),
            _batch(),
        )
        batch = dataclasses.replace(batch, rewards_MG=jax.ShapeDtypeStruct((rows // 4, 4), jnp.float32))
        S = batch.mask_BS.shape[1]
        f32_BS = jax.ShapeDtypeStruct((rows, S), jnp.float32)
        opt_state = jax.eval_shape(make_optimizer(config).init, params)
        lowered = train_step.lower(params, opt_state, batch, f32_BS, f32_BS,
                                   jax.ShapeDtypeStruct((rows,), bool), config=config)
        analysis = lowered.compile().memory_analysis()
        assert analysis is not None  # XLA:CPU reports it
        return analysis.temp_size_in_bytes

    bounded = dict(micro_batch_size=4, logits_chunk=4)
    small, large = temp_bytes(8, **bounded), temp_bytes(64, **bounded)
    assert large <= 1.05 * small
    # The plain step holds [B, S, V] float32 logits (and their gradient): 64 rows × 7 × 4096 × 4,
    # which alone is over 3 times the micro-batched step's whole temporary memory.
    logits = 64 * 7 * 4096 * 4
    assert temp_bytes(64) > logits > 3 * large


def test_tied_embeddings_take_the_head_and_the_lookup_gradient():
    """A tied embedding is both the lookup and the LM head: the micro-batched step adds both
    gradients into one leaf (``runtime.trainer.accumulate``), as autodiff of the plain step does."""
    _assert_equivalent(_results()["tied/whole"], _results()["tied/bounded"])


@pytest.mark.slow
def test_the_leaf_by_leaf_update_is_the_optax_chain(monkeypatch):
    """The micro-batched step's optimizer (``optimizer.update_leaf_by_leaf``, large leaves in blocks
    of rows) against ``make_optimizer``'s optax chain: clipping active, weight decay, warmup,
    a second step from a non-zero state; blocks of 64 bytes make every matrix go row block by
    row block."""
    monkeypatch.setattr(optimizer_module, "UPDATE_BLOCK_BYTES", 64)
    config = dataclasses.replace(_config("grpo"), learning_rate=0.1, adam_eps=1e-8,
                                 max_grad_norm=0.5, weight_decay=0.1, warmup_steps=3)
    params = _params()
    keys = iter(jax.random.split(jax.random.key(5), 64))
    grads = jax.tree.map(lambda x: jax.random.normal(next(keys), x.shape), params)
    tx = make_optimizer(config)
    state = tx.init(params)
    _, state = tx.update(grads, state, params)  # a state with moments and a count of 1
    grads = jax.tree.map(lambda g: 2.0 * g[::-1] if g.ndim else g, grads)
    with jax.numpy_dtype_promotion("standard"):
        updates, want_state = tx.update(grads, state, params)
    want = optax.apply_updates(params, updates)
    assert optax.tree.norm(grads) > 10 * config.max_grad_norm  # the clip acts
    update = jax.jit(functools.partial(optimizer_module.update_leaf_by_leaf, config=config.optimizer))
    got, got_state = update(grads, state, params)
    assert jax.tree.structure(got_state) == jax.tree.structure(want_state)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path((want, want_state)),
                            jax.tree.leaves((got, got_state)), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7, err_msg=jax.tree_util.keystr(path))
    assert any(np.any(np.asarray(a) != np.asarray(b)) for a, b in
               zip(jax.tree.leaves(got), jax.tree.leaves(params), strict=True))


def test_rematerialised_layers_attend_in_query_blocks_with_the_dense_result(monkeypatch):
    """With remat every layer attends ``REMAT_QUERY_BLOCK`` queries at a time and runs its MLP
    ``REMAT_TOKEN_BLOCK`` positions at a time; at 3 and 5 (blocks of 3, 3, 2 and of 5, 3 over
    the batch's 8 positions) the decoder's output and its parameter gradient are the plain
    layers'."""
    monkeypatch.setattr(transformer, "REMAT_QUERY_BLOCK", 3)
    monkeypatch.setattr(transformer, "REMAT_TOKEN_BLOCK", 5)
    params, batch = _params(), _batch()
    h0_BTD = transformer.embed(params, batch.tokens_BT, config=MODEL)
    weights_BTD = jax.random.normal(jax.random.key(9), h0_BTD.shape)

    def loss(p, remat):
        out_BTD = transformer.decoder(p, h0_BTD, batch.attention_BT, config=MODEL, remat=remat)
        return jnp.sum(weights_BTD * out_BTD)

    gradient = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    (want, want_grads), (got, got_grads) = gradient(params, False), gradient(params, True)
    assert float(got) == pytest.approx(float(want), rel=1e-6)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(want_grads),
                            jax.tree.leaves(got_grads), strict=True):
        # Blocks of queries are matmuls of other shapes: float32 sums in other orders (measured
        # worst case 2.3e-5 relative, 3e-6 absolute).
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5, err_msg=jax.tree_util.keystr(path))
