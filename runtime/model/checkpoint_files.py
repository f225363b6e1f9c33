"""A checkpoint's own files, read and copied as a hostile directory could offer them.

Every file of a checkpoint directory that rlx reads (``rlx run``) or copies (``rlx export``) goes
through here:

- a name is a plain file name in the directory (the shard names of
  ``model.safetensors.index.json`` too): no ``/``, ``..`` or absolute names;
- the file is a regular file of the directory itself: a symbolic link is refused (opened with
  ``O_NOFOLLOW``), so a checkpoint cannot have ``merges.txt -> ~/.ssh/id_rsa`` read or exported;
  so is a FIFO or a device, which would block or never end;
- a copy keeps its source's permission bits;
- JSON is read through one bounded reader: a size ceiling, UTF-8, a nesting ceiling, no
  ``NaN``/``Infinity`` (nor numbers that overflow a float) and Python's limit on the digits of an
  integer, each failure one line naming the file.

The checkpoint directory itself may be reached through a link (the user named it).
"""

from __future__ import annotations

import errno
import json
import math
import os
import pathlib
import stat
from typing import Any

from runtime.errors import UsageError

MAX_JSON_BYTES = 64 << 20  # a tokenizer_config.json with every added token is a few MiB
MAX_JSON_DEPTH = 64  # a checkpoint's JSON nests a handful of levels
_LINK_HINT = ("rlx reads only a checkpoint's own regular files (a Hugging Face cache snapshot links its files: "
              "download with --local-dir, or copy the checkpoint with cp -rL)")


def check_name(directory: str | os.PathLike, name: Any, where: str) -> str:
    """``name`` when it is a plain file name in the checkpoint ``directory`` (``where`` says who
    named it, for the message)."""
    if (not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name):
        raise UsageError(f"{directory}: {where} names the file {name!r}; accepted: plain names of files in the "
                         "checkpoint directory (no '/', '..' or absolute paths)")
    return name


def _open(directory: pathlib.Path, name: str, where: str) -> int | None:
    """A read-only descriptor of the regular file ``directory/name``, or None when it is absent."""
    path = directory / check_name(directory, name, where)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP or os.path.islink(path):
            raise UsageError(f"{path} is a symbolic link (to {os.readlink(path)!r}); {_LINK_HINT}") from None
        raise UsageError(f"{path} cannot be read: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(f"{path} is not a regular file; {_LINK_HINT}")
    return fd


def checkpoint_file(directory: str | os.PathLike, name: str, *, where: str = "rlx") -> pathlib.Path | None:
    """``directory/name`` when it is a regular file of the checkpoint, None when it is absent.

    For readers that take a path (safetensors): the file is checked here, then opened by name.

    Raises:
      UsageError: the name leaves the directory, or the file is a link or not a regular file.
    """
    root = pathlib.Path(directory)
    fd = _open(root, name, where)
    if fd is None:
        return None
    os.close(fd)
    return root / name


def file_mode(directory: str | os.PathLike, name: str) -> int | None:
    """The permission bits of checkpoint file ``name`` (None when absent)."""
    fd = _open(pathlib.Path(directory), name, "rlx")
    if fd is None:
        return None
    try:
        return stat.S_IMODE(os.fstat(fd).st_mode)
    finally:
        os.close(fd)


def read_bytes(directory: str | os.PathLike, name: str, *, max_bytes: int, where: str = "rlx") -> bytes | None:
    """The contents of checkpoint file ``name`` (None when absent), refused above ``max_bytes``."""
    root = pathlib.Path(directory)
    fd = _open(root, name, where)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UsageError(f"{root / name} is larger than {max_bytes:,} bytes; it is not a checkpoint's "
                         f"{'JSON file' if name.endswith('.json') else 'file'} of a size rlx reads")
    return data


def copy_file(directory: str | os.PathLike, name: str, target: str | os.PathLike) -> bool:
    """Copy checkpoint file ``name`` into the directory ``target`` (replacing a file of that name,
    never following a link there) with its permission bits; False when it is absent."""
    root = pathlib.Path(directory)
    fd = _open(root, name, "rlx")
    if fd is None:
        return False
    with os.fdopen(fd, "rb") as src:
        mode = stat.S_IMODE(os.fstat(src.fileno()).st_mode)
        out = pathlib.Path(target) / name
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
        with open(os.open(out, flags, mode & 0o700 | 0o600), "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
            os.fchmod(dst.fileno(), mode)
    return True


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            node = list(node.values())
        if isinstance(node, list):
            deepest = max(deepest, depth)
            if depth <= MAX_JSON_DEPTH:
                stack.extend((child, depth + 1) for child in node)
    return deepest


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of a float's range")
    return value


def _constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number; accepted: finite numbers")


def parse_json(data: bytes, path: str | os.PathLike) -> Any:
    """``data`` (the file ``path``) as JSON: UTF-8, finite numbers, at most ``MAX_JSON_DEPTH``
    levels; every failure is one line naming ``path``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path} is not UTF-8 text (byte {e.start}: {data[e.start:e.start + 1]!r}); "
                         "a checkpoint's JSON files are UTF-8") from None
    try:
        value = json.loads(text, parse_float=_finite, parse_constant=_constant)
    except RecursionError:
        raise UsageError(f"{path} nests more than {MAX_JSON_DEPTH} levels of JSON arrays and objects") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{path} is not valid JSON: {e}") from None
    except ValueError as e:  # a non-finite number, or an integer past Python's digit limit
        raise UsageError(f"{path} is not accepted JSON: {' '.join(str(e).split())[:200]}") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise UsageError(f"{path} nests more than {MAX_JSON_DEPTH} levels of JSON arrays and objects")
    return value


def read_json(directory: str | os.PathLike, name: str, *, where: str = "rlx") -> dict[str, Any] | None:
    """Checkpoint file ``name`` as a JSON object (None when absent), through the bounded reader."""
    data = read_bytes(directory, name, max_bytes=MAX_JSON_BYTES, where=where)
    if data is None:
        return None
    path = pathlib.Path(directory) / name
    value = parse_json(data, path)
    if not isinstance(value, dict):
        raise UsageError(f"{path} must hold a JSON object, got {type(value).__name__}")
    return value


__all__ = ["MAX_JSON_BYTES", "MAX_JSON_DEPTH", "check_name", "checkpoint_file", "copy_file", "file_mode", "parse_json",
           "read_bytes", "read_json"]
