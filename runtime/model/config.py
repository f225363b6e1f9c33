"""Typed configuration of the decoder (Llama / Mistral / Qwen2 / Qwen3 family)."""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

from runtime.errors import UsageError

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
ROPE_TYPES = ("linear", "llama3")
# Ceilings on every dimension, checked before anything is sized by one: each admits the released
# models up to the trillion-parameter scale several times over (the largest have ~256k tokens,
# hidden 16-25k, ~130 layers and heads, head_dim 256, intermediate 53k, 10M positions) and refuses
# the absurd ones a hostile config.json could name.
MAX_DIMENSIONS = {
    "vocab_size": 1 << 22,
    "hidden_size": 1 << 16,
    "num_layers": 1 << 10,
    "num_heads": 1 << 10,
    "num_kv_heads": 1 << 10,
    "intermediate_size": 1 << 19,
    "head_dim": 1 << 11,
    "max_position_embeddings": 1 << 25,
}
MAX_PARAMETERS = 1 << 42  # ~4.4e12: four times the largest released dense or sparse model
MAX_ROPE_THETA = 1e15  # released models use 1e4 to 1e8
MAX_ROPE_FACTOR = 1e6  # released scalings use 2 to 64


def _real(name: str, value, *, low: float, high: float, low_open: bool = True) -> None:
    """Refuse ``value`` unless it is a finite real number in ``(low, high]`` (``[low, high]``
    when not ``low_open``)."""
    ok = (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
          and (value > low if low_open else value >= low) and value <= high)
    if not ok:
        bound = f"{'>' if low_open else '>='} {low:g} and <= {high:g}"
        raise UsageError(f"model config {name}={value!r}: must be a finite number {bound}")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Rotary frequency scaling (see ``runtime.model.rope``); ``None`` in a config means none."""

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self):
        if self.rope_type not in ROPE_TYPES:
            raise UsageError(
                f"rope scaling type {self.rope_type!r} is not supported; accepted: "
                f"{', '.join(ROPE_TYPES)} (or no scaling)"
            )
        _real("rope_scaling.factor", self.factor, low=0, high=MAX_ROPE_FACTOR)
        _real("rope_scaling.low_freq_factor", self.low_freq_factor, low=0, high=MAX_ROPE_FACTOR)
        _real("rope_scaling.high_freq_factor", self.high_freq_factor, low=0, high=MAX_ROPE_FACTOR)
        positions = self.original_max_position_embeddings
        if (not isinstance(positions, int) or isinstance(positions, bool)
                or not 0 < positions <= MAX_DIMENSIONS["max_position_embeddings"]):
            raise UsageError(f"rope scaling original_max_position_embeddings={positions!r}: must be an integer in "
                             f"[1, {MAX_DIMENSIONS['max_position_embeddings']}]")
        if not self.high_freq_factor > self.low_freq_factor > 0:
            raise UsageError(
                f"rope scaling factor={self.factor!r}, low_freq_factor={self.low_freq_factor!r}, "
                f"high_freq_factor={self.high_freq_factor!r}: need factor > 0 and "
                "high_freq_factor > low_freq_factor > 0"
            )


DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a decoder-only transformer.

    RMSNorm, rotary position embeddings, grouped-query attention (``num_heads`` a multiple of
    ``num_kv_heads``), SwiGLU MLP. ``architecture`` names the Hugging Face family the weights are
    exchanged with: ``"llama"`` (``LlamaForCausalLM``), ``"mistral"`` (``MistralForCausalLM``, no
    biases), ``"qwen2"`` (``Qwen2ForCausalLM``, which always has q/k/v biases) or ``"qwen3"``
    (``Qwen3ForCausalLM``: ``qk_norm``, an RMSNorm over each head of q and k before the rotary
    embedding, and a ``head_dim`` that need not be ``hidden_size / num_heads``). ``dtype`` is the
    compute dtype, ``param_dtype`` the dtype the parameters are stored and trained in; norms,
    softmax and logits are always float32.

    ``sliding_window`` (Mistral; None = none) is the number of keys a query may see, itself
    included. Attention here is always full causal attention, which is the same computation as
    long as no sequence is longer than the window: ``check_sequence_length`` refuses longer ones.

    The config is hashable, so it can be a static argument of ``jax.jit``.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    head_dim: int | None = None
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    max_position_embeddings: int = 2048
    architecture: str = "llama"
    dtype: str = "float32"
    param_dtype: str = "float32"
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None

    def __post_init__(self):
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise UsageError(f"model config {name}={value!r}: must be a positive integer")
            if value > MAX_DIMENSIONS[name]:
                raise UsageError(f"model config {name}={value}: at most {MAX_DIMENSIONS[name]} is accepted")
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise UsageError(
                    f"model config hidden_size={self.hidden_size} is not a multiple of "
                    f"num_heads={self.num_heads}; set head_dim explicitly"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if (not isinstance(self.head_dim, int) or isinstance(self.head_dim, bool) or self.head_dim <= 0
                or self.head_dim % 2 or self.head_dim > MAX_DIMENSIONS["head_dim"]):
            raise UsageError(
                f"model config head_dim={self.head_dim!r}: must be a positive even integer, at most "
                f"{MAX_DIMENSIONS['head_dim']}"
            )
        if self.num_kv_heads > self.num_heads:
            raise UsageError(f"model config num_kv_heads={self.num_kv_heads} exceeds num_heads={self.num_heads}")
        if self.parameter_count > MAX_PARAMETERS:
            raise UsageError(
                f"model config of {self.parameter_count:.3g} parameters (vocab_size={self.vocab_size}, "
                f"hidden_size={self.hidden_size}, num_layers={self.num_layers}, intermediate_size="
                f"{self.intermediate_size}, ...): at most {MAX_PARAMETERS:.3g} are accepted"
            )
        if self.num_heads % self.num_kv_heads:
            raise UsageError(
                f"model config num_heads={self.num_heads} is not a multiple of "
                f"num_kv_heads={self.num_kv_heads}"
            )
        if self.architecture not in ARCHITECTURES:
            raise UsageError(
                f"model config architecture={self.architecture!r}: accepted: "
                f"{', '.join(ARCHITECTURES)}"
            )
        if self.sliding_window is not None and (
            not isinstance(self.sliding_window, int)
            or isinstance(self.sliding_window, bool)
            or not 0 < self.sliding_window <= MAX_DIMENSIONS["max_position_embeddings"]
        ):
            raise UsageError(
                f"model config sliding_window={self.sliding_window!r}: must be a positive "
                f"integer or None (at most {MAX_DIMENSIONS['max_position_embeddings']})"
            )
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                raise UsageError(
                    f"model config {name}={getattr(self, name)!r}: accepted: {', '.join(DTYPES)}"
                )
        _real("rope_theta", self.rope_theta, low=0, high=MAX_ROPE_THETA)
        _real("rms_norm_eps", self.rms_norm_eps, low=0, high=1)
        _real("initializer_range", self.initializer_range, low=0, high=1e3, low_open=False)
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(self, name)
            ids = value if isinstance(value, tuple) else (value,)
            if any(
                i is not None and (not isinstance(i, int) or not 0 <= i < self.vocab_size)
                for i in ids
            ):
                raise UsageError(
                    f"model config {name}={value!r}: token ids must be in [0, {self.vocab_size})"
                )

    @property
    def parameter_count(self) -> int:
        """The number of parameters the config describes (the attention biases and norms too)."""
        assert self.head_dim is not None  # filled in by __post_init__
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = self.hidden_size * (2 * q + 2 * kv) + (q + 2 * kv) * self.qkv_bias
        layer = attention + 3 * self.hidden_size * self.intermediate_size + 2 * self.hidden_size
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + embeddings + self.hidden_size

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def parameter_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    @property
    def attention_scale(self) -> float:
        """``1 / sqrt(head_dim)``, applied once to the attention scores."""
        assert self.head_dim is not None  # filled in by __post_init__
        return float(self.head_dim) ** -0.5

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The end-of-sequence ids as a tuple (empty when unset)."""
        if self.eos_token_id is None:
            return ()
        return self.eos_token_id if isinstance(self.eos_token_id, tuple) else (self.eos_token_id,)

    def check_sequence_length(self, length: int) -> None:
        """Refuse sequences of ``length`` tokens longer than the sliding window, which full causal
        attention would not reproduce."""
        if self.sliding_window is not None and length > self.sliding_window:
            raise UsageError(
                f"sequences of {length} tokens exceed the model's sliding_window="
                f"{self.sliding_window}; sliding-window attention is not supported, so sequences "
                f"(longest prompt + sampling.max_tokens) must be at most {self.sliding_window} tokens"
            )

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)
