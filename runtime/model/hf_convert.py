"""Pure conversions between Hugging Face checkpoints and ``ModelConfig`` + flax parameters.

Covers ``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM`` and
``Qwen3ForCausalLM``. A Hugging Face ``Linear`` weight is
``[out, in]``; a flax ``Dense`` kernel is ``[in, out]``: kernels are transposed, everything else
(embeddings, norm scales, biases) is copied. ``source`` arguments only name the checkpoint in
error messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from runtime.errors import UsageError
from runtime.model.config import ARCHITECTURES, ModelConfig, RopeScaling
from runtime.model.transformer import init_params

HF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
# What Transformers assumes when a config.json leaves these fields out.
_QWEN3_HEAD_DIM = 128
_MISTRAL_SLIDING_WINDOW = 4096
# Buffers some checkpoints carry that hold no learned state.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def _number(value: Any, name: str, source: str) -> float:
    """A config.json number as a float; its range is ``ModelConfig``'s to check."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(f"{source}: {name}={value!r} is not accepted; it must be a number")
    try:
        return float(value)
    except OverflowError:
        digits = str(value)
        raise UsageError(f"{source}: {name}={digits[:12]}... ({len(digits)} digits) is out of a float's range") from None


def _section(hf: Mapping[str, Any], name: str, source: str) -> Mapping[str, Any]:
    value = hf.get(name)
    if value is not None and not isinstance(value, Mapping):
        raise UsageError(f"{source}: {name} must be an object or null, got {type(value).__name__}")
    return value or {}


def _rope(hf: Mapping[str, Any], source: str) -> tuple[float, RopeScaling | None]:
    """``(rope_theta, scaling)`` from a Transformers 4 (``rope_theta`` + ``rope_scaling``) or
    Transformers 5 (``rope_parameters``) config."""
    rope = {**_section(hf, "rope_scaling", source), **_section(hf, "rope_parameters", source)}
    theta = _number(rope.get("rope_theta", hf.get("rope_theta", 10000.0)), "rope_theta", source)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        return theta, None
    fields = {
        k: rope[k]
        for k in (
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
        )
        if k in rope
    }
    try:
        return theta, RopeScaling(rope_type=rope_type, **fields)
    except (UsageError, TypeError) as e:
        raise UsageError(f"{source}: {e}") from e


def _rope_to_hf(config: ModelConfig) -> dict[str, Any]:
    scaling = config.rope_scaling
    if scaling is None:
        parameters: dict[str, Any] = {"rope_type": "default"}
    elif scaling.rope_type == "linear":
        parameters = {"rope_type": "linear", "factor": scaling.factor}
    else:
        parameters = {
            "rope_type": scaling.rope_type,
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
        }
    return {
        "rope_theta": config.rope_theta,
        "rope_scaling": None if scaling is None else parameters,
        "rope_parameters": {**parameters, "rope_theta": config.rope_theta},
    }


def config_from_hf(
    hf: Mapping[str, Any], *, source: str = "config.json", **overrides: Any
) -> ModelConfig:
    """A ``ModelConfig`` from a Hugging Face ``config.json`` dict; ``overrides`` win."""
    arch = hf.get("model_type")
    if arch not in ARCHITECTURES:
        raise UsageError(
            f"{source}: model_type {arch!r} is not supported; accepted: {', '.join(ARCHITECTURES)}"
        )
    if hf.get("hidden_act", "silu") != "silu":
        raise UsageError(
            f"{source}: hidden_act {hf['hidden_act']!r} is not supported; accepted: 'silu'"
        )
    if hf.get("mlp_bias", False):
        raise UsageError(f"{source}: mlp_bias=true is not supported; accepted: false")
    if hf.get("use_sliding_window", False):
        raise UsageError(f"{source}: use_sliding_window=true is not supported; accepted: false")
    missing = [
        k
        for k in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
        )
        if k not in hf
    ]
    if missing:
        raise UsageError(f"{source}: missing required fields {', '.join(missing)}")
    rope_theta, rope_scaling = _rope(hf, source)
    if arch == "qwen2":
        qkv_bias, o_bias = True, False
    elif arch == "mistral":
        qkv_bias = o_bias = False
    else:
        qkv_bias = o_bias = bool(hf.get("attention_bias", False))
    head_dim = hf.get("head_dim")
    if head_dim is None and arch == "qwen3":
        head_dim = _QWEN3_HEAD_DIM
    sliding_window = None
    if arch == "mistral":
        sliding_window = hf.get("sliding_window", _MISTRAL_SLIDING_WINDOW)
    fields = dict(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"],
        num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"],
        head_dim=head_dim,
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        rms_norm_eps=_number(hf.get("rms_norm_eps", 1e-6), "rms_norm_eps", source),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        qk_norm=arch == "qwen3",
        sliding_window=sliding_window,
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        architecture=arch,
        initializer_range=_number(hf.get("initializer_range", 0.02), "initializer_range", source),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=hf.get("eos_token_id"),
        pad_token_id=hf.get("pad_token_id"),
    )
    fields.update(overrides)
    try:
        return ModelConfig(**fields)
    except UsageError as e:
        raise UsageError(f"{source}: {e}") from None


def config_to_hf(config: ModelConfig) -> dict[str, Any]:
    """The ``config.json`` dict Transformers 4 and 5 load as the same architecture."""
    c = config
    if c.architecture == "qwen2" and (not c.qkv_bias or c.o_bias):
        raise UsageError(
            f"qwen2 needs qkv_bias=True and o_bias=False, got {c.qkv_bias} and {c.o_bias}"
        )
    if c.architecture in ("llama", "qwen3") and c.qkv_bias != c.o_bias:
        raise UsageError(
            f"{c.architecture} biases q/k/v and o together; got qkv_bias={c.qkv_bias}, "
            f"o_bias={c.o_bias}"
        )
    if c.architecture == "mistral" and (c.qkv_bias or c.o_bias):
        raise UsageError(
            f"mistral has no attention biases, got qkv_bias={c.qkv_bias}, o_bias={c.o_bias}"
        )
    if c.qk_norm != (c.architecture == "qwen3"):
        raise UsageError(
            f"{c.architecture} with qk_norm={c.qk_norm}: only qwen3 has (and needs) q/k norms"
        )
    if c.sliding_window is not None and c.architecture != "mistral":
        raise UsageError(
            f"{c.architecture} with sliding_window={c.sliding_window}: only mistral has one here"
        )
    eos = list(c.eos_token_id) if isinstance(c.eos_token_id, tuple) else c.eos_token_id
    hf = {
        "architectures": [HF_ARCHITECTURES[c.architecture]],
        "model_type": c.architecture,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.rms_norm_eps,
        **_rope_to_hf(c),
        "tie_word_embeddings": c.tie_word_embeddings,
        "initializer_range": c.initializer_range,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": eos,
        "pad_token_id": c.pad_token_id,
        "torch_dtype": c.param_dtype,
        "use_cache": True,
    }
    if c.architecture == "llama":
        hf.update(attention_bias=c.qkv_bias, mlp_bias=False)
    elif c.architecture == "mistral":
        hf.update(sliding_window=c.sliding_window)
    else:
        hf.update(use_sliding_window=False, sliding_window=None, max_window_layers=c.num_layers)
        if c.architecture == "qwen3":
            hf.update(attention_bias=c.qkv_bias)
    return hf


def _layout(config: ModelConfig) -> dict[str, tuple[tuple[str, ...], bool]]:
    """Hugging Face tensor name -> (flax parameter path, transposed?)."""
    table: dict[str, tuple[tuple[str, ...], bool]] = {
        "model.embed_tokens.weight": (("embed_tokens", "embedding"), False),
        "model.norm.weight": (("norm", "scale"), False),
    }
    if not config.tie_word_embeddings:
        table["lm_head.weight"] = (("lm_head", "kernel"), True)
    for i in range(config.num_layers):
        hf, ours = f"model.layers.{i}.", f"layers_{i}"
        table[hf + "input_layernorm.weight"] = ((ours, "input_layernorm", "scale"), False)
        table[hf + "post_attention_layernorm.weight"] = (
            (ours, "post_attention_layernorm", "scale"),
            False,
        )
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            table[hf + f"self_attn.{proj}.weight"] = ((ours, "self_attn", proj, "kernel"), True)
        if config.qkv_bias:
            for proj in ("q_proj", "k_proj", "v_proj"):
                table[hf + f"self_attn.{proj}.bias"] = ((ours, "self_attn", proj, "bias"), False)
        if config.o_bias:
            table[hf + "self_attn.o_proj.bias"] = ((ours, "self_attn", "o_proj", "bias"), False)
        if config.qk_norm:
            for norm in ("q_norm", "k_norm"):
                table[hf + f"self_attn.{norm}.weight"] = ((ours, "self_attn", norm, "scale"), False)
        for proj in ("gate_proj", "up_proj", "down_proj"):
            table[hf + f"mlp.{proj}.weight"] = ((ours, "mlp", proj, "kernel"), True)
    return table


def _get(tree: Mapping, path: tuple[str, ...]):
    for key in path:
        tree = tree[key]
    return tree


def _set(tree: dict, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def params_from_hf(
    tensors: Mapping[str, Any], config: ModelConfig, *, source: str = "checkpoint"
) -> dict:
    """Flax parameters (in ``config.param_dtype``) from Hugging Face tensors by name."""
    layout = _layout(config)
    missing = sorted(set(layout) - set(tensors))
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        raise UsageError(f"{source}: missing weights {shown}")
    unexpected = sorted(
        name
        for name in set(tensors) - set(layout)
        if not name.endswith(_IGNORED_SUFFIXES)
        and not (name == "lm_head.weight" and config.tie_word_embeddings)
    )
    if unexpected:
        raise UsageError(
            f"{source}: unexpected weights {', '.join(unexpected[:5])} for a "
            f"{config.architecture} model (unsupported architecture variant?)"
        )
    shapes = jax.eval_shape(lambda: init_params(config, key=jax.random.key(0)))
    params: dict = {}
    for name, (path, transposed) in layout.items():
        value = jnp.asarray(tensors[name])
        if transposed:
            value = value.T
        expected = _get(shapes, path).shape
        if value.shape != expected:
            raise UsageError(
                f"{source}: weight {name} has shape {tuple(tensors[name].shape)}, the config "
                f"implies {expected[::-1] if transposed else expected}"
            )
        _set(params, path, value.astype(config.parameter_dtype))
    return params


def params_to_hf(params: Mapping, config: ModelConfig) -> dict[str, np.ndarray | jax.Array]:
    """Hugging Face tensors by name from flax parameters (contiguous, in the parameters' dtype)."""
    out: dict[str, np.ndarray | jax.Array] = {}
    for name, (path, transposed) in _layout(config).items():
        value = jnp.asarray(_get(params, path))
        out[name] = jnp.array(value.T if transposed else value, copy=True)
    return out
