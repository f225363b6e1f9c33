"""A loss whose value is a reference loss and whose gradient is the unified surrogate's.

The objectives report each algorithm's reference value (the clipped PPO surrogate, DPO's
``softplus(-βΔ)``, ...) but differentiate the unified form ``-Σ sg[c] ℓ``, in which all the
algorithm-specific work (aggregation, importance weight, clip indicator, advantage) has been
folded into the constant coefficient ``c``. A custom JVP says exactly that, so the reference
value is computed once and never differentiated, and the backward pass is a single elementwise
``-c · cotangent``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


@jax.custom_jvp
def unified_loss(value: jax.Array, coef: jax.Array, logp: jax.Array) -> jax.Array:
    """Returns ``value``; its derivative is that of ``-Σ coef · logp`` in ``logp`` alone.

    Args:
      value: scalar reference loss, treated as a constant.
      coef: gradient coefficient of every log-prob, same shape as ``logp``, treated as a
        constant (so second derivatives in ``logp`` are zero).
      logp: the differentiated log-probs; 0 wherever ``coef`` must not reach.
    """
    del coef, logp
    return value


@unified_loss.defjvp
def _unified_loss_jvp(primals, tangents):
    value, coef, _ = primals
    logp_dot = tangents[2]
    return value, -jnp.sum(jax.lax.stop_gradient(coef) * logp_dot)
