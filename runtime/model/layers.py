"""Building blocks of the decoder: RMSNorm, attention projections, SwiGLU MLP.

Parameter names follow Hugging Face's Llama / Qwen2 / Qwen3 modules (``q_proj``, ``q_norm``,
``input_layernorm``, …) so the checkpoint mapping is a rename plus a transpose. Attention itself
is not computed here: ``DecoderLayer`` takes an ``attend`` function, so the full forward (dense
causal attention) and the paged prefill/decode paths run the very same projections, norms and MLP.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from kernels.dtypes import promote_types
from runtime.model.config import ModelConfig
from runtime.model.rope import apply_rotary, rotary_angles

# attend(q_BTHD, k_BTKD, v_BTKD) -> (attn_BTHD, state): the attention of one layer.
Attend = Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, object]]


def weight_init(config: ModelConfig):
    """Normal(0, initializer_range), the Hugging Face default for these families."""
    return nn.initializers.normal(stddev=config.initializer_range)


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * scale``, normalised in float32 (as Hugging Face does)."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x_BTD: jax.Array) -> jax.Array:
        scale_D = self.param(
            "scale", nn.initializers.ones, (x_BTD.shape[-1],), self.config.parameter_dtype
        )
        x32_BTD = x_BTD.astype(jnp.float32)
        var_BT1 = jnp.mean(jnp.square(x32_BTD), axis=-1, keepdims=True)
        normed_BTD = (x32_BTD * jax.lax.rsqrt(var_BT1 + self.config.rms_norm_eps)).astype(
            x_BTD.dtype
        )
        # Explicit where strict numerics ask for it: the scale broadcasts over the leading axes
        # and both operands go to their promoted dtype, as implicit promotion would.
        dtype = promote_types(scale_D.dtype, normed_BTD.dtype)
        scale_11D = scale_D.reshape((1,) * (normed_BTD.ndim - 1) + scale_D.shape).astype(dtype)
        return (scale_11D * normed_BTD.astype(dtype)).astype(self.config.compute_dtype)


class Attention(nn.Module):
    """Projections of grouped-query attention; the attention itself is ``attend``."""

    config: ModelConfig

    def setup(self):
        c = self.config
        dense = dict(
            dtype=c.compute_dtype, param_dtype=c.parameter_dtype, kernel_init=weight_init(c)
        )
        self.q_proj = nn.Dense(c.num_heads * c.head_dim, use_bias=c.qkv_bias, **dense)
        self.k_proj = nn.Dense(c.num_kv_heads * c.head_dim, use_bias=c.qkv_bias, **dense)
        self.v_proj = nn.Dense(c.num_kv_heads * c.head_dim, use_bias=c.qkv_bias, **dense)
        self.o_proj = nn.Dense(c.hidden_size, use_bias=c.o_bias, **dense)
        if c.qk_norm:  # Qwen3: one RMSNorm over head_dim, shared by the heads
            self.q_norm = RMSNorm(c)
            self.k_norm = RMSNorm(c)

    def __call__(
        self, x_BTD: jax.Array, positions_BT: jax.Array, attend: Attend
    ) -> tuple[jax.Array, object]:
        c = self.config
        assert c.head_dim is not None  # filled in by ModelConfig.__post_init__
        B, T, _ = x_BTD.shape
        angles_BTF = rotary_angles(positions_BT, c)
        q_BTHD = self.q_proj(x_BTD).reshape(B, T, c.num_heads, c.head_dim)
        k_BTKD = self.k_proj(x_BTD).reshape(B, T, c.num_kv_heads, c.head_dim)
        if c.qk_norm:
            q_BTHD, k_BTKD = self.q_norm(q_BTHD), self.k_norm(k_BTKD)
        q_BTHD = apply_rotary(q_BTHD, angles_BTF)
        k_BTKD = apply_rotary(k_BTKD, angles_BTF)
        v_BTKD = self.v_proj(x_BTD).reshape(B, T, c.num_kv_heads, c.head_dim)
        attn_BTHD, state = attend(q_BTHD, k_BTKD, v_BTKD)
        return self.o_proj(attn_BTHD.reshape(B, T, c.num_heads * c.head_dim)), state


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    config: ModelConfig

    def setup(self):
        c = self.config
        dense = dict(
            use_bias=False,
            dtype=c.compute_dtype,
            param_dtype=c.parameter_dtype,
            kernel_init=weight_init(c),
        )
        self.gate_proj = nn.Dense(c.intermediate_size, **dense)
        self.up_proj = nn.Dense(c.intermediate_size, **dense)
        self.down_proj = nn.Dense(c.hidden_size, **dense)

    def __call__(self, x_BTD: jax.Array) -> jax.Array:
        return self.down_proj(nn.silu(self.gate_proj(x_BTD)) * self.up_proj(x_BTD))


class DecoderLayer(nn.Module):
    """Pre-norm block: ``h += attn(norm(h)); h += mlp(norm(h))``."""

    config: ModelConfig

    def setup(self):
        self.input_layernorm = RMSNorm(self.config)
        self.self_attn = Attention(self.config)
        self.post_attention_layernorm = RMSNorm(self.config)
        self.mlp = MLP(self.config)

    def __call__(
        self, h_BTD: jax.Array, positions_BT: jax.Array, attend: Attend
    ) -> tuple[jax.Array, object]:
        attn_BTD, state = self.self_attn(self.input_layernorm(h_BTD), positions_BT, attend)
        h_BTD = h_BTD + attn_BTD
        return h_BTD + self.mlp(self.post_attention_layernorm(h_BTD)), state
