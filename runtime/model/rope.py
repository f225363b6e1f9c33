"""Rotary position embeddings, with Llama 3 and linear frequency scaling.

Frequencies ``inv_freq_f = theta^(-2f / head_dim)`` for ``f < head_dim / 2``; a token at position
``p`` rotates the pair ``(x_f, x_{f + head_dim/2})`` by ``p * inv_freq_f`` (Hugging Face's
``rotate_half`` convention). Scaling rewrites ``inv_freq`` only:

- ``linear``: ``inv_freq / factor``;
- ``llama3``: with wavelength ``w = 2 pi / inv_freq`` and ``L`` the original context length,
  long wavelengths (``w > L / low_freq_factor``) are divided by ``factor``, short ones
  (``w < L / high_freq_factor``) kept, and the band between interpolated with
  ``s = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor)``:
  ``(1 - s) * inv_freq / factor + s * inv_freq``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from runtime.model.config import ModelConfig


def inverse_frequencies(config: ModelConfig) -> jax.Array:
    """``inv_freq_F`` (float32, ``F = head_dim / 2``) after the configured scaling."""
    assert config.head_dim is not None  # filled in by ModelConfig.__post_init__
    exponents_F = jnp.arange(0, config.head_dim, 2, dtype=jnp.float32) / config.head_dim
    inv_freq_F = 1.0 / (jnp.float32(config.rope_theta) ** exponents_F)
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq_F
    if scaling.rope_type == "linear":
        return inv_freq_F / scaling.factor
    context = scaling.original_max_position_embeddings
    wavelen_F = 2 * math.pi / inv_freq_F
    scaled_F = jnp.where(
        wavelen_F > context / scaling.low_freq_factor, inv_freq_F / scaling.factor, inv_freq_F
    )
    smooth_F = (context / wavelen_F - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed_F = (1 - smooth_F) * scaled_F / scaling.factor + smooth_F * scaled_F
    medium_F = (wavelen_F >= context / scaling.high_freq_factor) & (
        wavelen_F <= context / scaling.low_freq_factor
    )
    return jnp.where(medium_F, smoothed_F, scaled_F)


def rotary_angles(positions_BT: jax.Array, config: ModelConfig) -> jax.Array:
    """``angles_BTF = position * inv_freq_F``, float32."""
    return positions_BT.astype(jnp.float32)[..., None] * inverse_frequencies(config)[None, None, :]


def apply_rotary(x_BTND: jax.Array, angles_BTF: jax.Array) -> jax.Array:
    """Rotate the two halves of each head by the angles (cos/sin computed in float32)."""
    angles_BT1D = jnp.concatenate([angles_BTF, angles_BTF], -1)[:, :, None, :]
    cos_BT1D = jnp.cos(angles_BT1D).astype(x_BTND.dtype)
    sin_BT1D = jnp.sin(angles_BT1D).astype(x_BTND.dtype)
    half = x_BTND.shape[-1] // 2
    rotated_BTND = jnp.concatenate([-x_BTND[..., half:], x_BTND[..., :half]], axis=-1)
    return (x_BTND * cos_BT1D + rotated_BTND * sin_BT1D).astype(x_BTND.dtype)
