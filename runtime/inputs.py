"""A run's input files, content-addressed: the data file, the checkpoint and the user's reward file,
by absolute path and sha256, as ``RunStarted`` records them (its fingerprint's ``inputs``).

A config names its inputs as the user typed them (``data.path``, ``model.path``,
``verifier.reward``, often relative);
the config is recorded as it is, so its digest never changes. Beside it the run records where
those names led and what the files held: :func:`record` of the resolved config. ``rlx resume``
and ``rlx replay`` then build from the recorded absolute paths (:func:`located`), so they read
the same files from any working directory, and refuse in one line naming the file when one of
them no longer holds what the run read (:func:`check`). A ledger written before inputs were
recorded is only warned about: its inputs cannot be checked.

The checkpoint's digests cover what rlx reads of it: ``config.json``, the weights
(``model.safetensors``, or the shard index and every shard it names) and the tokenizer, chat
template and generation files present. Files are hashed in 1 MiB blocks, so memory stays flat
for a checkpoint of any size.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from runtime.config import Config
from runtime.errors import UsageError

BLOCK = 1 << 20
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
CHECKPOINT_FILES = (
    "config.json", WEIGHTS_FILE, INDEX_FILE, "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json",
    "generation_config.json",
)
"""The files of a checkpoint directory rlx reads, where present (runtime.model.hf, hf_text)."""

Warn = Callable[[str], None]


def digest_file(path: str) -> str:
    """The sha256 of the file at ``path`` in hex, read in blocks; a file that cannot be read is a
    one-line error naming it."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while block := f.read(BLOCK):
                h.update(block)
    except OSError as e:
        raise UsageError(f"cannot read input file {path!r}: {e.strerror or e}") from None
    return h.hexdigest()


def _data_files(path: str) -> dict[str, str]:
    """The data file's digest under its own name; for a data directory, each regular file's
    under its relative name, in sorted order."""
    if not os.path.isdir(path):
        return {os.path.basename(path): digest_file(path)}
    out = {}
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            if os.path.isfile(full):
                out[os.path.relpath(full, path)] = digest_file(full)
    return out


def _shards(directory: str) -> list[str]:
    """The shard files the checkpoint's index names (none when it has no index)."""
    index = os.path.join(directory, INDEX_FILE)
    if not os.path.isfile(index):
        return []
    try:
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f).get("weight_map", {})
    except (OSError, ValueError, AttributeError) as e:
        raise UsageError(f"{index} is not a shard index: {e}") from None
    names = sorted({v for v in weight_map.values() if isinstance(v, str)}) if isinstance(weight_map, dict) else []
    bad = [n for n in names if os.path.basename(n) != n or n in ("", ".", "..")]
    if bad:
        raise UsageError(f"{index} names shards outside the checkpoint directory: {bad[:3]}")
    return names


def _checkpoint_files(directory: str) -> dict[str, str]:
    names = [n for n in CHECKPOINT_FILES if os.path.isfile(os.path.join(directory, n))]
    names += [n for n in _shards(directory) if n not in names]
    return {name: digest_file(os.path.join(directory, name)) for name in sorted(names)}


def record(config: Config) -> dict:
    """What ``RunStarted`` records of the run's input files: for ``data.path``, ``model.path`` and
    ``verifier.reward``'s file (each when set), the absolute path and the sha256 of each file
    read. Empty for the built-in task and model."""
    out: dict[str, Any] = {}
    if config.data.path is not None:
        path = os.path.abspath(config.data.path)
        out["data"] = {"path": path, "files": _data_files(path)}
    if config.model.path is not None:
        path = os.path.abspath(config.model.path)
        out["model"] = {"path": path, "files": _checkpoint_files(path)}
    if config.verifier.reward is not None:
        from verifiers.reward import split_spec

        path = os.path.abspath(split_spec(config.verifier.reward)[0])
        out["reward"] = {"path": path, "files": {os.path.basename(path): digest_file(path)}}
    return out


def recorded(fingerprint: Mapping[str, Any]) -> dict | None:
    """The inputs a ``RunStarted`` fingerprint records, or None when it predates them."""
    inputs = fingerprint.get("inputs")
    return dict(inputs) if isinstance(inputs, Mapping) else None


def located(config: Config, fingerprint: Mapping[str, Any]) -> Config:
    """``config`` (as logged) reading its inputs from the absolute paths the run recorded, so
    that it builds the same wherever it is resumed or replayed from. The logged config, and so
    its digest, is left as it is: this copy is only built from."""
    inputs = recorded(fingerprint) or {}
    data, model = inputs.get("data"), inputs.get("model")
    if isinstance(data, Mapping) and config.data.path is not None:
        config = dataclasses.replace(config, data=dataclasses.replace(config.data, path=str(data["path"])))
    if isinstance(model, Mapping) and config.model.path is not None:
        config = dataclasses.replace(config, model=dataclasses.replace(config.model, path=str(model["path"])))
    reward = inputs.get("reward")
    if isinstance(reward, Mapping) and config.verifier.reward is not None:
        from verifiers.reward import split_spec

        spec = f"{reward['path']}:{split_spec(config.verifier.reward)[1]}"
        config = dataclasses.replace(config, verifier=dataclasses.replace(config.verifier, reward=spec))
    return config


def _full(path: str, file: str) -> str:
    """The path of ``file`` of the input recorded at ``path`` (a file, or a directory of them)."""
    return os.path.join(path, file) if os.path.isdir(path) else path


def check(config: Config, fingerprint: Mapping[str, Any], *, what: str, warn: Warn) -> dict:
    """Refuse (``UsageError``, one line naming the file and the digest the run recorded) when the
    inputs of ``config`` (located) differ from those the run recorded in ``fingerprint``; ``what``
    names the command (``"resume"``, ``"replay"``). A fingerprint that records none is warned
    about. Returns the inputs as they are now."""
    then = recorded(fingerprint)
    for was in (then or {}).values():
        for file, digest in sorted(dict(was.get("files", {})).items()):
            full = _full(was["path"], file)
            if not os.path.isfile(full):
                raise UsageError(f"cannot {what}: input file {full!r} is missing (the run read it with sha256 {digest})")
    now = record(config)
    if then is None:
        if now:
            warn(f"warning: this run's ledger predates recorded input digests: the {what} cannot check that "
                 f"{' and '.join(sorted(now))} are the files the run read")
        return now
    for name in ("data", "model", "reward"):
        was, nowhere = then.get(name), now.get(name)
        if was is None:
            continue
        if nowhere is None:
            raise UsageError(f"cannot {what}: the run read {name} from {was['path']!r}, which this config does not name")
        files = dict(was.get("files", {}))
        current = nowhere["files"]
        for file in sorted(set(files) | set(current)):
            full = _full(was["path"], file)
            if file not in files:
                raise UsageError(f"cannot {what}: input file {full!r} was not there when the run started (its "
                                 f"{name} files were {sorted(files)})")
            if current[file] != files[file]:
                raise UsageError(f"cannot {what}: input file {full!r} has changed since the run read it (sha256 "
                                 f"{current[file]}, the run recorded {files[file]}); restore it to {what}")
    return now


__all__ = ["check", "digest_file", "located", "record", "recorded"]
