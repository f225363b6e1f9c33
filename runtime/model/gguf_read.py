"""A GGUF file read as a hostile file could offer it: the ``gguf`` package's reader, bounded.

``gguf.GGUFReader`` memory-maps the file and walks its header trusting every count and length it
finds: an array that claims 2**60 entries loops until memory runs out, a tensor whose data lies
past the end of a truncated file becomes a short view that fails later, far from the cause.
``BoundedReader`` is that reader with each count checked before it is used:

- every read stays inside the file (a truncated file is named as such);
- at most ``MAX_FIELDS`` metadata keys and ``MAX_TENSORS`` tensors;
- at most ``MAX_ARRAY_ITEMS`` metadata array entries in all (the vocabulary, merges, scores and
  token types of the largest released tokenizers are about 1M);
- no string longer than ``MAX_STRING_BYTES``.

Tensors stay memory-mapped; ``dequantized`` turns one into float32 with ``gguf.quants``.
Metadata values are read through ``scalar``/``strings``/``integers``, which check their types.
Every failure is a one-line ``UsageError`` naming the file.
"""

from __future__ import annotations

import os
import stat
from typing import Any, Literal

import gguf
import numpy as np
import numpy.typing as npt

from runtime.errors import UsageError

MAX_FIELDS = 1 << 12  # released files carry about 40 keys
MAX_TENSORS = 1 << 16  # 1,024 layers of ~16 tensors, far past any released decoder
MAX_ARRAY_ITEMS = 1 << 22
MAX_STRING_BYTES = 1 << 20  # the longest strings are chat templates, a few KiB to tens of KiB
MAGIC = b"GGUF"
Q = gguf.GGMLQuantizationType
# The tensor types turned into float32 here, all by ``gguf.quants.dequantize``.
SUPPORTED_TYPES = (Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0,
                   Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K)
V = gguf.GGUFValueType
_INTEGERS = (V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.INT32, V.UINT64, V.INT64)
_FLOATS = (V.FLOAT32, V.FLOAT64)


class _Refused(Exception):
    """A bound the reader was stopped at (the message says which)."""


class BoundedReader(gguf.GGUFReader):
    """``gguf.GGUFReader`` that checks each count and offset it reads before using it."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self._array_items = 0
        super().__init__(path)

    def _get(self, offset: int, dtype: npt.DTypeLike, count: int = 1,
             override_order: None | Literal["I", "S", "<"] = None) -> npt.NDArray[Any]:
        count = int(count)
        end = int(offset) + np.dtype(dtype).itemsize * count
        if count < 0 or end > self.data.size:
            raise _Refused(f"it is {self.data.size:,} bytes long but names data up to byte {end:,} "
                           "(a truncated or corrupt file)")
        return super()._get(offset, dtype, count, override_order)

    def _get_str(self, offset: int) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint8]]:
        length = int(self._get(offset, np.uint64)[0])
        if length > MAX_STRING_BYTES:
            raise _Refused(f"a string at byte {offset:,} claims {length:,} bytes; at most {MAX_STRING_BYTES:,} "
                           "are accepted")
        return super()._get_str(offset)

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list[npt.NDArray[Any]], list[int],
                                                                        list[gguf.GGUFValueType]]:
        if raw_type == V.ARRAY:
            self._array_items += int(self._get(orig_offs + 4, np.uint64)[0])
            if self._array_items > MAX_ARRAY_ITEMS:
                raise _Refused(f"its metadata arrays hold more than {MAX_ARRAY_ITEMS:,} entries in all "
                               f"(an array at byte {orig_offs:,} reaches {self._array_items:,})")
        return super()._get_field_parts(orig_offs, raw_type)

    def _build_fields(self, offs: int, count: int) -> int:
        if int(count) > MAX_FIELDS:
            raise _Refused(f"it claims {int(count):,} metadata keys; at most {MAX_FIELDS:,} are accepted")
        return super()._build_fields(offs, count)

    def _build_tensor_info(self, offs: int, count: int) -> tuple[int, list[gguf.ReaderField]]:
        if int(count) > MAX_TENSORS:
            raise _Refused(f"it claims {int(count):,} tensors; at most {MAX_TENSORS:,} are accepted")
        return super()._build_tensor_info(offs, count)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())[:300]


def open_gguf(path: str | os.PathLike) -> BoundedReader:
    """The GGUF file ``path``, its header read and checked, its tensors memory-mapped.

    Raises:
      UsageError: the path is not a regular file, is empty, is not GGUF, is big-endian, or its
        header is truncated, corrupt or past a bound of this module.
    """
    shown = os.fspath(path)
    try:
        info = os.stat(shown)
    except OSError as e:
        raise UsageError(f"GGUF file {shown!r} cannot be read: {e.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise UsageError(f"GGUF file {shown!r} is not a regular file")
    try:
        with open(shown, "rb") as f:
            head = f.read(len(MAGIC))
    except OSError as e:
        raise UsageError(f"GGUF file {shown!r} cannot be read: {e.strerror}") from None
    if head != MAGIC:
        what = "is empty" if not head else f"starts with {head!r}"
        raise UsageError(f"{shown} is not a GGUF file: it {what}, a GGUF file starts with {MAGIC!r}")
    try:
        reader = BoundedReader(shown)
    except _Refused as e:
        raise UsageError(f"{shown} is not accepted: {e}") from None
    except (ValueError, KeyError, IndexError, OverflowError, TypeError) as e:  # the reader's own refusals
        raise UsageError(f"{shown} is not a readable GGUF file: {_one_line(e)}") from None
    if reader.byte_order != "I":
        raise UsageError(f"{shown} is a big-endian GGUF file; only little-endian files are accepted")
    return reader


def _field(reader: BoundedReader, key: str) -> gguf.ReaderField | None:
    return reader.fields.get(key)


def _refuse_type(reader: BoundedReader, key: str, field: gguf.ReaderField, wanted: str) -> UsageError:
    kinds = "/".join(t.name for t in field.types) or "untyped value"
    return UsageError(f"{reader.path}: metadata {key} is {kinds}; a {wanted} is expected")


def scalar(reader: BoundedReader, key: str, kind: type, default: Any = None) -> Any:
    """The metadata value ``key`` as ``kind`` (int, float, str or bool), ``default`` when absent.

    A float32 value comes back as the shortest decimal that is the same float32 (``1e-05``, not
    ``9.999999747378752e-06``), so a config written from it reads as the original did.
    """
    field = _field(reader, key)
    if field is None:
        return default
    allowed = {int: _INTEGERS, float: (*_FLOATS, *_INTEGERS), str: (V.STRING,), bool: (V.BOOL,)}[kind]
    if len(field.types) != 1 or field.types[0] not in allowed:
        raise _refuse_type(reader, key, field, kind.__name__)
    try:
        value = field.contents()
    except UnicodeDecodeError:
        raise UsageError(f"{reader.path}: metadata {key} is not UTF-8 text") from None
    if field.types[0] == V.FLOAT32:
        return float(str(np.float32(value)))
    return kind(value)


def strings(reader: BoundedReader, key: str) -> list[str] | None:
    """The metadata array of strings ``key`` (None when absent)."""
    field = _field(reader, key)
    if field is None:
        return None
    if field.types not in ([V.ARRAY, V.STRING], [V.ARRAY]):
        raise _refuse_type(reader, key, field, "array of strings")
    try:
        return [str(s) for s in field.contents()]
    except UnicodeDecodeError:
        raise UsageError(f"{reader.path}: metadata {key} holds text that is not UTF-8") from None


def integers(reader: BoundedReader, key: str) -> list[int] | None:
    """The metadata array of integers ``key`` (None when absent)."""
    field = _field(reader, key)
    if field is None:
        return None
    if not (field.types == [V.ARRAY] or (len(field.types) == 2 and field.types[0] == V.ARRAY
                                          and field.types[1] in _INTEGERS)):
        raise _refuse_type(reader, key, field, "array of integers")
    return [int(v) for v in field.contents()]


def tensor_shape(tensor: gguf.ReaderTensor) -> tuple[int, ...]:
    """The shape of a tensor in row-major order (GGUF lists its dimensions fastest first)."""
    return tuple(int(d) for d in reversed(tensor.shape.tolist()))


def check_tensors(reader: BoundedReader) -> None:
    """Refuse a file holding a tensor type ``dequantized`` does not take, naming the tensor, or
    tensors that claim more bytes than the file holds: each lies inside the file (the reader
    checked), and together they may not overlap into more, so what dequantizing allocates is
    bounded by the file's size."""
    for tensor in reader.tensors:
        if tensor.tensor_type not in SUPPORTED_TYPES:
            raise UsageError(f"{reader.path}: tensor {tensor.name} is {tensor.tensor_type.name}, which is "
                             f"not supported; accepted: {', '.join(t.name for t in SUPPORTED_TYPES)}")
    claimed, held = sum(int(t.n_bytes) for t in reader.tensors), reader.data.size - reader.data_offset
    if claimed > held:
        raise UsageError(f"{reader.path}: its tensors claim {claimed:,} bytes of data, more than the {held:,} the "
                         "file holds (overlapping tensors)")


def dequantized(tensor: gguf.ReaderTensor) -> np.ndarray:
    """A float32 copy of ``tensor`` in its row-major shape (``tensor_shape``)."""
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    return np.array(values, dtype=np.float32, copy=True).reshape(tensor_shape(tensor))


__all__ = ["MAX_ARRAY_ITEMS", "MAX_FIELDS", "MAX_STRING_BYTES", "MAX_TENSORS", "SUPPORTED_TYPES", "BoundedReader",
           "check_tensors", "dequantized", "integers", "open_gguf", "scalar", "strings", "tensor_shape"]
