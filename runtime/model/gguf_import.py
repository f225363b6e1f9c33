"""A GGUF checkpoint (llama.cpp's format) as a Hugging Face checkpoint directory.

``import_gguf(file, out)`` reads a decoder of the Llama, Qwen2 or Qwen3 family from a GGUF file
(the ``gguf`` package's reader, bounded by ``runtime.model.gguf_read``), dequantizes its tensors
to float32 (``gguf.quants``) and writes what ``load_hf``, ``rlx run --model``, ``rlx export`` and
Transformers read: ``config.json``, ``model.safetensors`` (float32), ``tokenizer.json``,
``tokenizer_config.json`` (special tokens, ``add_bos_token`` and the chat template),
``special_tokens_map.json``, ``chat_template.jinja`` and ``generation_config.json``.

llama.cpp stores a Llama model's q and k projections with the rows of each head reordered for
its rotary kernel: Hugging Face rotates the two halves of a head (``rotate_half``), llama.cpp
adjacent pairs, so its converter interleaves the halves (``convert_hf_to_gguf``'s ``permute``).
The import undoes that for ``llama`` files (Mistral's GGUF files are ``llama`` files too); Qwen2
and Qwen3 files keep Hugging Face's order.

Nothing is written until the whole file has been read and checked; the checkpoint is written
into a temporary directory beside ``out`` and renamed into place, so a refusal or a crash leaves
no partial checkpoint. Every refusal is a one-line ``UsageError``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import secrets
import shutil
from typing import Any

import numpy as np

from runtime.errors import UsageError
from runtime.model.config import ModelConfig, RopeScaling
from runtime.model.gguf_read import (
    BoundedReader,
    check_tensors,
    dequantized,
    open_gguf,
    scalar,
    tensor_shape,
)
from runtime.model.gguf_tokenizer import GgufText, gguf_text
from runtime.model.hf import CONFIG_FILE, GENERATION_CONFIG_FILE, TOKENIZER_FILE, write_weights
from runtime.model.hf_convert import config_to_hf
from runtime.model.hf_text import CHAT_TEMPLATE_FILE, SPECIAL_TOKENS_MAP_FILE, TOKENIZER_CONFIG_FILE

# GGUF ``general.architecture`` -> Hugging Face ``model_type``; whether q/k rows are permuted.
ARCHITECTURES = {"llama": ("llama", True), "qwen2": ("qwen2", False), "qwen3": ("qwen3", False)}
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_NAME = re.compile(r"blk\.(0|[1-9][0-9]{0,5})\.(.+)")


@dataclasses.dataclass(frozen=True)
class Imported:
    """What ``import_gguf`` wrote.

    Attributes:
      out: the checkpoint directory.
      architecture: its Hugging Face ``model_type``.
      parameters: the number of parameters (a tied embedding counted once).
      vocab_size: the model's vocabulary.
      tensor_types: the GGUF tensor types the weights were stored in (``Q4_1``, ``F32``, ...).
      files: the names of the files written.
    """

    out: str
    architecture: str
    parameters: int
    vocab_size: int
    tensor_types: tuple[str, ...]
    files: tuple[str, ...]


def hf_tensor_name(name: str, num_layers: int) -> str | None:
    """The Hugging Face name of GGUF tensor ``name``, or None when it has none here."""
    if name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[name]
    match = _LAYER_NAME.fullmatch(name)
    if match is None or int(match.group(1)) >= num_layers or match.group(2) not in _LAYER_TENSORS:
        return None
    return f"model.layers.{match.group(1)}.{_LAYER_TENSORS[match.group(2)]}"


def unpermute_rotary(w: np.ndarray, heads: int) -> np.ndarray:
    """Rows of a q or k projection (or bias) from llama.cpp's rotary order back to Hugging Face's.

    llama.cpp's converter reshapes each head's ``head_dim`` rows as ``[2, head_dim / 2]`` and
    swaps the two axes (the halves become interleaved pairs); this is the inverse swap.
    """
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _required(reader: BoundedReader, key: str) -> int:
    value = scalar(reader, key, int)
    if value is None:
        raise UsageError(f"{reader.path}: metadata {key} is missing")
    return value


def _required_float(reader: BoundedReader, key: str) -> float:
    value = scalar(reader, key, float)
    if value is None:
        raise UsageError(f"{reader.path}: metadata {key} is missing")
    return value


def _rope_scaling(reader: BoundedReader, arch: str) -> RopeScaling | None:
    kind = scalar(reader, f"{arch}.rope.scaling.type", str, "none")
    factor = scalar(reader, f"{arch}.rope.scaling.factor", float)
    if kind == "none" and (linear := scalar(reader, f"{arch}.rope.scale_linear", float)) is not None:
        kind, factor = "linear", linear
    if kind == "none":
        return None
    if kind != "linear":
        raise UsageError(f"{reader.path}: {arch}.rope.scaling.type {kind!r} is not supported; accepted: none, linear")
    try:
        return RopeScaling("linear", factor=factor)
    except UsageError as e:
        raise UsageError(f"{reader.path}: {e}") from None


def model_config(reader: BoundedReader, tensors: dict[str, Any]) -> tuple[ModelConfig, bool]:
    """The ``ModelConfig`` a GGUF file's metadata and tensor names describe (special ids left
    unset), and whether its q/k rows are in llama.cpp's rotary order."""
    where = reader.path
    gguf_arch = scalar(reader, "general.architecture", str)
    if gguf_arch not in ARCHITECTURES:
        raise UsageError(f"{where}: architecture {gguf_arch!r} is not supported; accepted: {', '.join(ARCHITECTURES)}")
    arch, permuted = ARCHITECTURES[gguf_arch]
    if "rope_freqs.weight" in tensors:
        raise UsageError(f"{where}: per-frequency rotary factors (rope_freqs.weight, Llama 3.1-style rope "
                         "scaling) are not supported")
    embedding = tensors.get("token_embd.weight")
    if embedding is None or len(embedding.shape) != 2:
        raise UsageError(f"{where}: the token embedding token_embd.weight is missing or not 2-D")
    heads = _required(reader, f"{gguf_arch}.attention.head_count")
    hidden = _required(reader, f"{gguf_arch}.embedding_length")
    head_dim = scalar(reader, f"{gguf_arch}.attention.key_length", int)
    head_size = head_dim if head_dim is not None else hidden // max(heads, 1)
    for key in ("attention.value_length", "rope.dimension_count"):
        value = scalar(reader, f"{gguf_arch}.{key}", int)
        if value is not None and value != head_size:
            raise UsageError(f"{where}: {gguf_arch}.{key}={value} differs from the head size {head_size}; "
                             "only heads of one size, rotated in full, are supported")
    try:
        config = ModelConfig(
            vocab_size=tensor_shape(embedding)[0],
            hidden_size=hidden,
            num_layers=_required(reader, f"{gguf_arch}.block_count"),
            num_heads=heads,
            num_kv_heads=scalar(reader, f"{gguf_arch}.attention.head_count_kv", int, heads),
            intermediate_size=_required(reader, f"{gguf_arch}.feed_forward_length"),
            head_dim=head_dim,
            rope_theta=scalar(reader, f"{gguf_arch}.rope.freq_base", float, 10000.0),
            rope_scaling=_rope_scaling(reader, gguf_arch),
            rms_norm_eps=_required_float(reader, f"{gguf_arch}.attention.layer_norm_rms_epsilon"),
            tie_word_embeddings="output.weight" not in tensors,
            qkv_bias="blk.0.attn_q.bias" in tensors,
            o_bias="blk.0.attn_output.bias" in tensors,
            qk_norm=arch == "qwen3",
            max_position_embeddings=scalar(reader, f"{gguf_arch}.context_length", int, 2048),
            architecture=arch,
        )
    except UsageError as e:
        raise UsageError(f"{where}: {e}") from None
    return config, permuted


def _expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Hugging Face tensor name -> shape, for ``config`` (traced, nothing allocated)."""
    import jax

    from runtime.model.hf_convert import params_to_hf
    from runtime.model.transformer import init_params

    shapes = jax.eval_shape(lambda: params_to_hf(init_params(config, key=jax.random.key(0)), config))
    return {name: tuple(s.shape) for name, s in shapes.items()}


def _weights(reader: BoundedReader, config: ModelConfig, permuted: bool) -> dict[str, np.ndarray]:
    """Every tensor, checked against ``config`` before any is dequantized, by Hugging Face name."""
    where = reader.path
    named: dict[str, Any] = {}
    for tensor in reader.tensors:
        hf = hf_tensor_name(tensor.name, config.num_layers)
        if hf is None:
            raise UsageError(f"{where}: unexpected tensor {tensor.name} for a {config.architecture} model "
                             f"of {config.num_layers} layers (an unsupported variant?)")
        named[hf] = tensor
    expected = _expected_shapes(config)
    missing = sorted(set(expected) - set(named))
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise UsageError(f"{where}: tensors missing for a {config.architecture} model: {shown}")
    for name, tensor in named.items():
        if name not in expected:
            raise UsageError(f"{where}: unexpected tensor {tensor.name} for this {config.architecture} model")
        if tensor_shape(tensor) != expected[name]:
            raise UsageError(f"{where}: tensor {tensor.name} has shape {list(tensor_shape(tensor))}, the metadata "
                             f"implies {list(expected[name])}")
    weights = {}
    for name, tensor in named.items():
        value = dequantized(tensor)
        if permuted and (".q_proj." in name or ".k_proj." in name):
            value = unpermute_rotary(value, config.num_heads if ".q_proj." in name else config.num_kv_heads)
        weights[name] = value
    return weights


def _text_files(config: ModelConfig, text: GgufText) -> dict[str, Any]:
    """The tokenizer's JSON files and the generation defaults, by file name."""
    tokenizer_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **text.special_tokens,
        "add_bos_token": text.add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": config.max_position_embeddings,
    }
    if text.chat_template is not None:
        tokenizer_config["chat_template"] = text.chat_template
    generation: dict[str, Any] = {
        "bos_token_id": config.bos_token_id,
        "eos_token_id": list(text.end_ids) if len(text.end_ids) > 1 else config.eos_token_id,
        "pad_token_id": config.pad_token_id,
    }
    return {
        TOKENIZER_CONFIG_FILE: tokenizer_config,
        SPECIAL_TOKENS_MAP_FILE: dict(text.special_tokens),
        GENERATION_CONFIG_FILE: {k: v for k, v in generation.items() if v is not None},
    }


def _check_out(out: pathlib.Path) -> None:
    if out.is_symlink():
        raise UsageError(f"--out {str(out)!r} is a symbolic link; give the path itself")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {str(out)!r} exists and is not an empty directory; give a new or empty one")


def import_gguf(file: str | os.PathLike, out: str | os.PathLike) -> Imported:
    """Convert the GGUF checkpoint ``file`` into a Hugging Face checkpoint directory ``out``.

    Args:
      file: a GGUF file of a ``llama``, ``qwen2`` or ``qwen3`` decoder with a byte-level BPE
        tokenizer, its tensors in a type of ``gguf_read.SUPPORTED_TYPES``.
      out: a new or empty directory.

    Returns:
      An ``Imported`` describing what was written.

    Raises:
      UsageError: ``out`` is not new or empty, or the file is not such a checkpoint (truncated,
        not GGUF, an unsupported architecture, tokenizer or tensor type, inconsistent metadata).
        Nothing is written then.
    """
    target = pathlib.Path(out)
    _check_out(target)
    reader = open_gguf(file)
    check_tensors(reader)
    tensors = {t.name: t for t in reader.tensors}
    config, permuted = model_config(reader, tensors)
    text = gguf_text(reader, config.vocab_size)
    try:
        config = config.replace(bos_token_id=text.special_ids.get("bos_token"),
                                eos_token_id=text.end_ids[0] if text.end_ids else None,
                                pad_token_id=text.special_ids.get("pad_token"))
    except UsageError as e:
        raise UsageError(f"{reader.path}: {e}") from None
    weights = _weights(reader, config, permuted)
    parameters = sum(w.size for w in weights.values())
    types = tuple(sorted({t.tensor_type.name for t in reader.tensors}))

    staging = target.parent / f".{target.name}.importing-{secrets.token_hex(6)}"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
        files = write_weights(staging, weights)
        del weights
        documents = {CONFIG_FILE: config_to_hf(config), **_text_files(config, text)}
        for name, document in documents.items():
            (staging / name).write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        text.tokenizer.save(str(staging / TOKENIZER_FILE))
        files += [*documents, TOKENIZER_FILE]
        if text.chat_template is not None:
            (staging / CHAT_TEMPLATE_FILE).write_text(text.chat_template, encoding="utf-8")
            files.append(CHAT_TEMPLATE_FILE)
        mode = (staging / CONFIG_FILE).stat().st_mode & 0o777  # what the user's umask gives a new file
        for name in files:
            (staging / name).chmod(mode)
        os.replace(staging, target)
    except OSError as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise UsageError(f"--out {str(target)!r}: the checkpoint could not be written: {e.strerror or e}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Imported(str(target), config.architecture, parameters, config.vocab_size, types, tuple(sorted(files)))


__all__ = ["ARCHITECTURES", "Imported", "hf_tensor_name", "import_gguf", "model_config", "unpermute_rotary"]
