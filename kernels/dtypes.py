"""The dtypes that mixed operands are cast to, chosen explicitly.

Kernels and the model cast their operands to one dtype before combining them, so they also run
where implicit promotion is switched off (the tests run with
``jax_numpy_dtype_promotion="strict"``, which catches an accidental float64 or a silent int/float
mix). The dtype they cast to is the one JAX's standard promotion picks, so an explicit cast gives
the same bits as the implicit promotion it replaces.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def promote_types(a: jax.typing.DTypeLike, b: jax.typing.DTypeLike) -> np.dtype:
    """``jnp.promote_types(a, b)`` under standard promotion, whatever the promotion mode."""
    with jax.numpy_dtype_promotion("standard"):
        return jnp.promote_types(a, b)


def float_dtype(*operands: jax.typing.ArrayLike | jax.typing.DTypeLike) -> np.dtype:
    """The dtype a kernel computes ``operands`` in: their result type, at least float32.

    float64 stays float64 (tests ask for it); booleans, integers, float16, bfloat16 and float32
    give float32.
    """
    with jax.numpy_dtype_promotion("standard"):
        return jnp.promote_types(jnp.result_type(*operands), jnp.float32)
