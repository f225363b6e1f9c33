"""Reading and writing Hugging Face model directories (the I/O around ``hf_convert``).

A directory holds ``config.json``, the weights as ``model.safetensors`` or as shards listed by
``model.safetensors.index.json``, and optionally ``tokenizer.json``.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

from safetensors import safe_open
from safetensors.flax import save_file
from tokenizers import Tokenizer

from runtime.errors import UsageError
from runtime.model.checkpoint_files import check_name, checkpoint_file, file_mode, read_json
from runtime.model.hf_convert import config_from_hf, config_to_hf, params_from_hf, params_to_hf
from runtime.model.hf_text import load_tokenizer
from runtime.model.model import Model
from runtime.model.tokenizer import BOS, EOS, PAD, UNK

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
GENERATION_CONFIG_FILE = "generation_config.json"
# The files of a checkpoint that describe its tokenizer, chat template and generation defaults.
TOKENIZER_FILES = (
    TOKENIZER_FILE,
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    GENERATION_CONFIG_FILE,
)
DEFAULT_SHARD_BYTES = 5 * 2**30


def read_required_json(path: pathlib.Path) -> dict[str, Any]:
    """A checkpoint's JSON file through the bounded reader; one line naming it if it is missing."""
    data = read_json(path.parent, path.name)
    if data is None:
        raise UsageError(f"{path.parent}: missing {path.name}")
    return data


def _weight_files(directory: pathlib.Path) -> list[pathlib.Path]:
    """The checkpoint's safetensors files: each a regular file of ``directory`` (the index's shard
    names are plain file names in it, never links or paths elsewhere)."""
    single = checkpoint_file(directory, WEIGHTS_FILE)
    if single is not None:
        return [single]
    index = read_json(directory, INDEX_FILE)
    if index is None:
        raise UsageError(f"{directory}: no weights found; expected {WEIGHTS_FILE} or {INDEX_FILE}")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
        raise UsageError(f"{directory / INDEX_FILE} has no 'weight_map' object")
    where = f"{INDEX_FILE} weight_map"
    names = sorted({check_name(directory, name, where) for name in weight_map.values()})
    files = [checkpoint_file(directory, name, where=where) for name in names]
    absent = [name for name, f in zip(names, files, strict=True) if f is None]
    if absent:
        raise UsageError(f"{directory}: shards listed in {INDEX_FILE} are missing: {', '.join(absent)}")
    return [f for f in files if f is not None]


def _read_tensors(directory: pathlib.Path) -> dict[str, Any]:
    tensors = {}
    for file in _weight_files(directory):
        try:
            with safe_open(str(file), framework="flax") as f:
                for name in f.keys():
                    tensors[name] = f.get_tensor(name)
        except Exception as e:  # safetensors raises its own error types for corrupt files
            raise UsageError(f"{file} could not be read as safetensors: {e}") from e
    return tensors


def weight_modes(path: str | os.PathLike) -> int:
    """The permission bits every weights file of a checkpoint has (their intersection), which an
    export of it keeps."""
    directory = pathlib.Path(path)
    mode = 0o777
    for file in _weight_files(directory):
        mode &= file_mode(directory, file.name) or 0
    return mode


_SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}


def weight_dtypes(path: str | os.PathLike) -> dict[str, str]:
    """The dtype (numpy name) of every tensor of a checkpoint directory, read from the
    safetensors headers alone."""
    dtypes = {}
    for file in _weight_files(pathlib.Path(path)):
        try:
            with safe_open(str(file), framework="flax") as f:
                for name in f.keys():
                    stored = f.get_slice(name).get_dtype()
                    dtypes[name] = _SAFETENSORS_DTYPES.get(stored, stored.lower())
        except Exception as e:  # safetensors raises its own error types for corrupt files
            raise UsageError(f"{file} could not be read as safetensors: {e}") from e
    return dtypes


def load_hf(path: str | os.PathLike, **overrides: Any) -> Model:
    """Load a local Hugging Face Llama, Mistral, Qwen2 or Qwen3 checkpoint directory.

    Args:
      path: the directory.
      **overrides: ``ModelConfig`` fields to set, e.g. ``dtype="bfloat16"``; parameters are cast
        to ``param_dtype`` (float32 unless overridden).

    Returns:
      A ``Model`` with ``.config``, ``.params`` and ``.tokenizer`` (None without tokenizer.json).

    Raises:
      UsageError: the directory, its config or some weights are missing, or the architecture is
        not supported.
    """
    directory = pathlib.Path(path)
    if not directory.is_dir():
        raise UsageError(f"model path {str(path)!r} is not a directory")
    config_path = directory / CONFIG_FILE
    config = config_from_hf(read_required_json(config_path), source=str(config_path), **overrides)
    params = params_from_hf(_read_tensors(directory), config, source=str(directory))
    has_tokenizer = checkpoint_file(directory, TOKENIZER_FILE) is not None
    return Model(config, params, load_tokenizer(directory) if has_tokenizer else None)


def tokenizer_config(tokenizer: Tokenizer) -> dict[str, Any]:
    """``tokenizer_config.json`` so that ``AutoTokenizer`` wraps ``tokenizer.json``."""
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    for key, token in (
        ("bos_token", BOS),
        ("eos_token", EOS),
        ("pad_token", PAD),
        ("unk_token", UNK),
    ):
        if tokenizer.token_to_id(token) is not None:
            config[key] = token
    return config


def write_weights(
    directory: pathlib.Path,
    tensors: dict[str, Any],
    *,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> list[str]:
    """Write ``tensors`` as ``model.safetensors``, or, when they exceed ``max_shard_bytes``, as
    ``model-0000i-of-0000n.safetensors`` shards with ``model.safetensors.index.json`` (tensors in
    name order, as Transformers lays them out). Replaces the weights already in ``directory``.

    Returns:
      The names of the files written.
    """
    if max_shard_bytes <= 0:
        raise UsageError(f"max_shard_bytes={max_shard_bytes}: must be positive")
    shards: list[dict[str, Any]] = [{}]
    size = 0
    for name in sorted(tensors):
        nbytes = tensors[name].size * tensors[name].dtype.itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensors[name]
        size += nbytes
    for stale in [
        directory / WEIGHTS_FILE,
        directory / INDEX_FILE,
        *directory.glob("model-*-of-*.safetensors"),
    ]:
        stale.unlink(missing_ok=True)
    metadata = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(directory / WEIGHTS_FILE), metadata=metadata)
        return [WEIGHTS_FILE]
    weight_map = {}
    names = []
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(directory / name), metadata=metadata)
        weight_map.update({tensor: name for tensor in shard})
        names.append(name)
    total = sum(t.size * t.dtype.itemsize for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return [*names, INDEX_FILE]


def save_hf(
    path: str | os.PathLike, model: Model, *, max_shard_bytes: int = DEFAULT_SHARD_BYTES
) -> None:
    """Write ``model`` as a Hugging Face directory that Transformers loads.

    Weights larger than ``max_shard_bytes`` are split into ``model-0000i-of-0000n.safetensors``
    shards with an index, as Transformers does.
    """
    if max_shard_bytes <= 0:
        raise UsageError(f"max_shard_bytes={max_shard_bytes}: must be positive")
    directory = pathlib.Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONFIG_FILE).write_text(json.dumps(config_to_hf(model.config), indent=2) + "\n")
    tensors = params_to_hf(model.params, model.config)
    write_weights(directory, tensors, max_shard_bytes=max_shard_bytes)
    if model.tokenizer is not None:
        model.tokenizer.save(str(directory / TOKENIZER_FILE))
        (directory / "tokenizer_config.json").write_text(
            json.dumps(tokenizer_config(model.tokenizer), indent=2) + "\n"
        )
