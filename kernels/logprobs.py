"""Per-token log-probabilities and entropy of tempered logits.

This is the one definition of "the log-prob of a token" that the sampler records and the trainer
recomputes; using anything else on either side shows up as inference/trainer log-prob mismatch.
The temperature divides the logits *before* the log-softmax, in float32:

    log p_T(y | x) = z_y / T - log sum_v exp(z_v / T)
    H_T(x)         = - sum_v p_T(v | x) log p_T(v | x)

It is the distribution that temperature sampling draws from, before any top-k / top-p truncation:
truncation changes which tokens can be drawn, not the log-prob that is recorded. A non-positive
temperature (greedy decoding) scores the untempered distribution, ``T = 1``.

Every reduction runs over the vocabulary axis of one row only, so a row's values do not depend on
the other rows of the batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def tempered_log_softmax(logits_XV: jax.Array, temperature: float | jax.Array = 1.0) -> jax.Array:
    """``log_softmax(logits / T)`` over the last axis, in float32.

    Args:
      logits_XV: logits with any leading shape ``X`` and the vocabulary last.
      temperature: a scalar or an array broadcastable to ``X`` (one temperature per row, e.g. per
        request in a decode batch). Non-positive entries mean ``T = 1``.
    """
    return jax.nn.log_softmax(_tempered(logits_XV, temperature), axis=-1)


def _tempered(logits_XV: jax.Array, temperature: float | jax.Array) -> jax.Array:
    """``logits / T`` in float32, ``T = 1`` where the temperature is not positive."""
    temperature_X = jnp.broadcast_to(jnp.asarray(temperature, jnp.float32), logits_XV.shape[:-1])
    temperature_X1 = temperature_X[..., None]
    temperature_X1 = jnp.where(temperature_X1 > 0, temperature_X1, 1.0)
    return logits_XV.astype(jnp.float32) / temperature_X1


def token_logprobs(
    logits_XV: jax.Array, tokens_X: jax.Array, temperature: float | jax.Array = 1.0
) -> jax.Array:
    """``log p_T(tokens | ·)`` for each position, float32 with the shape of ``tokens_X``.

    ``logits_XV[..., :]`` is the distribution that ``tokens_X[...]`` was drawn from (for a
    sequence forward pass, shift the tokens by one before calling).
    """
    logp_XV = tempered_log_softmax(logits_XV, temperature)
    return jnp.take_along_axis(logp_XV, tokens_X[..., None].astype(jnp.int32), axis=-1)[..., 0]


def entropy(logits_XV: jax.Array, temperature: float | jax.Array = 1.0) -> jax.Array:
    """Entropy ``H_T`` of each row's tempered distribution, float32 of shape ``X``."""
    logp_XV = tempered_log_softmax(logits_XV, temperature)
    return -jnp.sum(jnp.exp(logp_XV) * logp_XV, axis=-1)


def token_logprobs_and_entropy(
    logits_XV: jax.Array, tokens_X: jax.Array, temperature: float | jax.Array = 1.0
) -> tuple[jax.Array, jax.Array]:
    """``(token_logprobs, entropy)`` from one log-softmax; same definitions as above."""
    logp_XV = tempered_log_softmax(logits_XV, temperature)
    logp_X = jnp.take_along_axis(logp_XV, tokens_X[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return logp_X, -jnp.sum(jnp.exp(logp_XV) * logp_XV, axis=-1)


def exact_token_logprobs(logits_XV: jax.Array, tokens_X: jax.Array, temperature: float | jax.Array = 1.0) -> jax.Array:
    """``token_logprobs`` (the same definition) computed so that a row's bits do not depend on
    the program around it: the exact-log-prob mode's (``runtime.numerics``) engine and train step.

    The maximum is exact in any order; the sum of the exponentials is a matrix-vector product with
    a vector of ones, whose order is the matmul's own, not that of a reduction the compiler may
    fuse with its neighbours (a train step's backward pass reads the same exponentials, and
    XLA:CPU then emits the fused sum another way).
    """
    z_XV = _tempered(logits_XV, temperature)
    shifted_XV = z_XV - jax.lax.stop_gradient(jnp.max(z_XV, axis=-1, keepdims=True))
    total_X = jnp.dot(jnp.exp(shifted_XV), jnp.ones(shifted_XV.shape[-1], jnp.float32))
    picked_X = jnp.take_along_axis(shifted_XV, tokens_X[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return picked_X - jnp.log(total_X)
