"""The optimizer of the warm start and of the RL step: AdamW, after an optional global-norm clip.

One builder, :func:`transformation`, for both: the RL step (``runtime.trainer.step``) clips the
gradient to ``trainer.max_grad_norm`` and may warm its learning rate up; the supervised warm start
(``runtime.trainer.pretrain``) does neither. The arithmetic is optax's, traced under JAX's
standard dtype promotion (:func:`standard_promotion`), so a configuration gives the bits it always
gave. :func:`update_leaf_by_leaf` is the clipped update one parameter at a time, for the
micro-batched step.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW's settings (hashable: a static argument of ``jit``).

    ``max_grad_norm``: the gradient is first clipped to that global norm; None, it is not (and the
    optimizer state has no clip stage). ``warmup_steps``: the learning rate rises linearly over the
    first steps, ``lr · min(1, (n + 1) / warmup_steps)`` at step ``n`` (0-based), so the first step
    already moves; 0, it is the constant ``lr``. ``weight_decay`` is decoupled (AdamW's).
    ``adam_b1``, ``adam_b2``, ``adam_eps`` default to optax's.
    """

    learning_rate: float
    weight_decay: float
    max_grad_norm: float | None = None
    warmup_steps: int = 0
    adam_b1: float = 0.9
    adam_b2: float = 0.999
    adam_eps: float = 1e-8


def standard_promotion(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """``tx`` with its ``init`` and ``update`` traced under JAX's standard dtype promotion.

    optax combines int32 step counts with float rates (``b1 ** count``), which strict promotion
    (the tests' setting, for this package's own code) rejects. Standard promotion is also what
    every run uses, so the optimizer's arithmetic, and its bits, are optax's own.
    """

    def init(params):
        with jax.numpy_dtype_promotion("standard"):
            return tx.init(params)

    def update(updates, state, params=None):
        with jax.numpy_dtype_promotion("standard"):
            return tx.update(updates, state, params)

    return optax.GradientTransformation(init, update)


def transformation(config: OptimizerConfig) -> optax.GradientTransformation:
    """The optimizer ``config`` describes: global-norm clipping (with a ``max_grad_norm``), then
    AdamW; its state is ``(clip state, AdamW state)``, or AdamW's alone without a clip."""
    adamw = _adamw(config)
    if config.max_grad_norm is None:
        return standard_promotion(adamw)
    return standard_promotion(optax.chain(optax.clip_by_global_norm(config.max_grad_norm), adamw))


def _adamw(config: OptimizerConfig) -> optax.GradientTransformation:
    """The AdamW stage of :func:`transformation` (after the clip, if any)."""
    lr = config.learning_rate
    learning_rate: optax.ScalarOrSchedule = lr
    if config.warmup_steps > 0:
        warmup = config.warmup_steps
        learning_rate = lambda count: lr * jnp.minimum(1.0, (count + 1) / warmup)  # noqa: E731
    return optax.adamw(
        learning_rate,
        b1=config.adam_b1,
        b2=config.adam_b2,
        eps=config.adam_eps,
        weight_decay=config.weight_decay,
    )


UPDATE_BLOCK_BYTES = 32 << 20  # most bytes of one leaf's rows that the update handles at once


def _row_block(x) -> int:
    """The largest divisor of ``x``'s row count whose rows fit ``UPDATE_BLOCK_BYTES`` (at least 1)."""
    if x.ndim == 0:
        return 0
    row_bytes = max(1, x.dtype.itemsize * (x.size // max(1, x.shape[0])))
    most = max(1, UPDATE_BLOCK_BYTES // row_bytes)
    return max(d for d in range(1, min(x.shape[0], most) + 1) if x.shape[0] % d == 0)


def update_leaf_by_leaf(grads, opt_state, params, config: OptimizerConfig):
    """``transformation(config).update`` then ``optax.apply_updates``, one parameter at a time.

    The same arithmetic as the optax chain (``optax.clip_by_global_norm``'s clip, then optax's
    AdamW on each leaf as a tree of its own), but its full-size intermediates (the clipped
    gradient, the update) exist for one leaf at a time: each leaf waits for the previous leaf's
    new value, where XLA would otherwise clip every leaf first and hold the whole clipped tree
    beside the gradient. ``config`` must clip (a ``max_grad_norm``). Returns
    ``(params, opt_state)`` in the optax state's structure.
    """
    if config.max_grad_norm is None:
        raise ValueError("update_leaf_by_leaf is the clipped optimizer's update: config.max_grad_norm is None")
    clip_state, (adam_state, *rest) = opt_state
    adamw = _adamw(config)
    max_norm = config.max_grad_norm
    with jax.numpy_dtype_promotion("standard"):
        g_norm = optax.tree.norm(grads)
    trigger = jnp.squeeze(g_norm < max_norm)
    g_leaves, treedef = jax.tree.flatten(grads)
    p_leaves = jax.tree.leaves(params)
    mu_leaves = jax.tree.leaves(adam_state.mu)
    nu_leaves = jax.tree.leaves(adam_state.nu)
    new_p, new_mu, new_nu = [], [], []

    def leaf_update(g, p, mu, nu):
        g = jax.lax.select(trigger, g, (g / g_norm.astype(g.dtype)) * max_norm)
        with jax.numpy_dtype_promotion("standard"):
            update, state = adamw.update(g, (adam_state._replace(mu=mu, nu=nu), *rest), p)
            return optax.apply_updates(p, update), state[0].mu, state[0].nu

    previous = None
    for g, p, mu, nu in zip(g_leaves, p_leaves, mu_leaves, nu_leaves, strict=True):
        if previous is not None:
            # 0·x is no constant to XLA (it is NaN for an infinite x): the leaf waits for the
            # previous one, and its value is unchanged (up to the sign of a zero).
            g = g + (previous.reshape(-1)[0] * 0).astype(g.dtype)
        block = _row_block(p)
        if block == 0 or block == p.shape[0]:  # a scalar, or a leaf whose rows all fit at once
            p, mu, nu = leaf_update(g, p, mu, nu)
        else:  # one block of rows after the other, written over the old values in place
            def rows(k, carry, g=g, block=block):
                start = k * block
                sliced = [jax.lax.dynamic_slice_in_dim(x, start, block) for x in (g, *carry)]
                return tuple(
                    jax.lax.dynamic_update_slice_in_dim(x, x_k, start, axis=0)
                    for x, x_k in zip(carry, leaf_update(*sliced), strict=True)
                )

            p, mu, nu = jax.lax.fori_loop(0, p.shape[0] // block, rows, (p, mu, nu))
        new_p.append(p)
        new_mu.append(mu)
        new_nu.append(nu)
        previous = p
    # The step counts (Adam's, the schedule's) advance alike for every leaf: those of any update.
    scalar = jnp.zeros((), jnp.float32)
    with jax.numpy_dtype_promotion("standard"):
        _, state = adamw.update(scalar, (adam_state._replace(mu=scalar, nu=scalar), *rest), scalar)
    adam_state = state[0]._replace(
        mu=jax.tree.unflatten(treedef, new_mu), nu=jax.tree.unflatten(treedef, new_nu)
    )
    return jax.tree.unflatten(treedef, new_p), (clip_state, (adam_state, *state[1:]))


__all__ = ["OptimizerConfig", "standard_promotion", "transformation", "update_leaf_by_leaf"]
