"""The one optimizer (``runtime.trainer.optimizer``) of the RL step and of the warm start, bit for bit.

Each optimizer takes five jitted steps on a small tree: gradients whose global norm is about 18 on
even steps (the RL step's clip at 1 acts) and 0.3 on odd ones (it does not), a warm-up over three
steps, weight decay, the leaf-by-leaf update with blocks of rows. The digests of the final
parameters and state were recorded with the code before the two optimizers shared a module
(``step.make_optimizer``, ``step._update_leaf_by_leaf`` and ``pretrain._Adam`` at commit 3c6d3b9):
on the stack that recorded them, the bits must be those. Another stack may round otherwise (the
run fingerprint's jax, jaxlib, backend and cpu, and optax), so everywhere the optimizers are also
checked, bit for bit, against optax's own formulation of what they were.
"""

from __future__ import annotations

import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from kernels.algorithms import configure
from runtime.config import PretrainConfig, TrainerConfig
from runtime.model import ModelConfig
from runtime.trainer import make_optimizer
from runtime.trainer import optimizer as optimizer_module
from runtime.trainer.optimizer import OptimizerConfig, standard_promotion, transformation, update_leaf_by_leaf
from runtime.trainer.pretrain import warm_start_optimizer
from runtime.trainer.step import StepConfig

MODEL = ModelConfig(vocab_size=13, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32)
SHAPES = {"b": (3,), "v": (2, 3, 2), "w": (4, 5)}
STEPS = 5
RL = TrainerConfig(learning_rate=0.05, weight_decay=0.1, max_grad_norm=1.0, warmup_steps=3)
WARM = PretrainConfig(learning_rate=1e-2)
# Rows of 20 bytes (w), 24 (v) and 4 (b): w is updated two rows at a time, v one, b at once.
BLOCK_BYTES = 40
RECORDED_ON = {"jax": "0.10.2", "jaxlib": "0.10.2", "optax": "0.2.8", "backend": "cpu", "cpu": "AMD EPYC"}
RECORDED = {
    "rl": "81c5abed554567f6e97914be383c92efbcf63ba3429718c11f6a952c67dd7bcd",
    "rl/leaf_by_leaf": "0c187e4a6825d1f1c297dd87eb8bf2f9554ee2cc0af428c16a1f482d873bc9ab",
    "warm_start": "1d676705cc880f4d6a3a6d417e185036d21cfd07a40db5bef491a7fef0befa47",
}


def _tree(seed: int, scale: float = 1.0) -> dict:
    rng = np.random.default_rng(seed)  # NumPy's generator: the same values on every machine
    return {k: jnp.asarray((scale * rng.standard_normal(shape)).astype(np.float32)) for k, shape in SHAPES.items()}


def _grads(n: int) -> dict:
    # ‖g‖ ≈ 3·√35 ≈ 18 on even steps, 0.05·√35 ≈ 0.3 on odd ones.
    return _tree(10 + n, 3.0 if n % 2 == 0 else 0.05)


def _trajectory(init, update) -> list:
    """``(params, state)`` after each of ``STEPS`` jitted ``update(params, state, grads)`` steps."""
    params = _tree(0)
    state = init(params)
    step = jax.jit(update)
    out = []
    for n in range(STEPS):
        params, state = step(params, state, _grads(n))
        out.append((params, state))
    return out


def _optax_steps(tx: optax.GradientTransformation):
    def update(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return tx.init, update


def _digest(tree) -> str:
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(tree):
        a = np.asarray(leaf)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _rl_step() -> StepConfig:
    return StepConfig.of(RL, model=MODEL, objective=configure("grpo"), temperature=1.0, group_size=1)


def _rl() -> list:
    return _trajectory(*_optax_steps(make_optimizer(_rl_step())))


def _rl_leaf_by_leaf() -> list:
    step = _rl_step()
    return _trajectory(make_optimizer(step).init, lambda p, s, g: update_leaf_by_leaf(g, s, p, step.optimizer))


def _warm_start() -> list:
    return _trajectory(*_optax_steps(transformation(warm_start_optimizer(WARM))))


def _assert_same_bits(got: list, want: list) -> None:
    for n, (g, w) in enumerate(zip(got, want, strict=True)):
        assert jax.tree.structure(g) == jax.tree.structure(w)
        for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(w), jax.tree.leaves(g), strict=True):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(b, a, err_msg=f"step {n}{jax.tree_util.keystr(path)}")


def test_the_optimizers_give_the_bits_recorded_before_they_shared_a_module(monkeypatch):
    from runtime.session import fingerprint

    stack = {**{k: v for k, v in fingerprint().items() if k in RECORDED_ON}, "optax": optax.__version__}
    if stack != RECORDED_ON:
        pytest.skip(f"the digests are the bits of {RECORDED_ON}, not of this stack ({stack})")
    monkeypatch.setattr(optimizer_module, "UPDATE_BLOCK_BYTES", BLOCK_BYTES)
    got = {"rl": _rl(), "rl/leaf_by_leaf": _rl_leaf_by_leaf(), "warm_start": _warm_start()}
    assert {name: _digest(steps[-1]) for name, steps in got.items()} == RECORDED


def test_the_rl_optimizer_is_optax_global_norm_clipping_then_adamw():
    # What step.make_optimizer built before: the clip, then optax.adamw with the step's settings
    # and a learning rate lr · min(1, (n + 1) / warmup) at step n.
    lr, warmup = RL.learning_rate, RL.warmup_steps
    tx = standard_promotion(optax.chain(
        optax.clip_by_global_norm(RL.max_grad_norm),
        optax.adamw(lambda count: lr * jnp.minimum(1.0, (count + 1) / warmup),
                    b1=0.9, b2=0.999, eps=1e-8, weight_decay=RL.weight_decay),
    ))
    want = _trajectory(*_optax_steps(tx))
    _assert_same_bits(_rl(), want)
    assert _rl_step().optimizer == OptimizerConfig(learning_rate=0.05, weight_decay=0.1, max_grad_norm=1.0,
                                                   warmup_steps=3, adam_b1=0.9, adam_b2=0.999, adam_eps=1e-8)


def test_the_warm_start_optimizer_is_optax_adamw_with_its_defaults():
    # What pretrain._Adam held before: optax.adamw(lr), optax's defaults (weight decay 1e-4),
    # no clip, no warm-up; its state is AdamW's alone.
    want = _trajectory(*_optax_steps(standard_promotion(optax.adamw(WARM.learning_rate))))
    _assert_same_bits(_warm_start(), want)


def test_the_warm_start_optimizer_is_a_static_value_without_clip_or_warm_up():
    config = warm_start_optimizer(WARM)
    assert config == OptimizerConfig(learning_rate=1e-2, weight_decay=1e-4, max_grad_norm=None, warmup_steps=0)
    # A static argument of the jitted warm-start step: equal settings, one compilation.
    assert hash(config) == hash(warm_start_optimizer(PretrainConfig(learning_rate=1e-2)))


def test_the_leaf_by_leaf_update_needs_the_clip():
    config = warm_start_optimizer(WARM)
    params = _tree(0)
    state = transformation(config).init(params)
    with pytest.raises(ValueError, match="max_grad_norm is None"):
        update_leaf_by_leaf(_grads(0), state, params, config)
