"""Canonical msgpack of plain values: one byte string per value.

Map keys are sorted, Python floats are always float64, tuples and lists both encode as arrays
(and decode as tuples), and numpy arrays are a msgpack extension (type 1) carrying dtype name,
shape and the raw little-endian bytes in C order. So the same value always gives the same bytes
— across processes, platforms and dict insertion orders — and arrays of token ids or log-probs
round-trip bit-exactly (NaN payloads included). Event bodies (``ledger.codec``) are such values.

Array extension payload (all integers little-endian)::

    u8 len(dtype_name) | dtype_name (ascii) | u8 ndim | ndim x u64 dims | raw bytes

Numpy scalars encode as 0-d arrays and decode as 0-d arrays.
"""

from __future__ import annotations

import functools
import struct
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import numpy as np

from ledger.errors import CodecError

ARRAY_EXT = 1
_SCALARS = frozenset({str, int, float, bool, bytes, type(None)})
_U64 = struct.Struct("<Q")
_new_tuple = tuple.__new__


@functools.lru_cache(maxsize=256)
def _dtype_from_name(name: str) -> np.dtype:
    try:
        return np.dtype(name).newbyteorder("<")
    except TypeError:
        pass
    try:  # bfloat16 and friends live in ml_dtypes (a numpy extension, no JAX needed)
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    except (ImportError, AttributeError, TypeError):
        raise CodecError(f"unknown array dtype {name!r} in event body") from None


@functools.lru_cache(maxsize=16)
def _dims(ndim: int) -> struct.Struct:
    return struct.Struct(f"<{ndim}Q")


@functools.lru_cache(maxsize=256)
def _array_head(dtype: np.dtype, ndim: int) -> tuple[bytes, struct.Struct] | None:
    """The dtype-and-rank prefix of an array payload and the struct of its dims, or None for a
    big-endian dtype (converted first). Raises for dtypes that have no canonical bytes."""
    if dtype.hasobject or dtype.fields is not None:
        raise CodecError(f"cannot encode array of dtype {dtype}: only numeric and bool arrays")
    if dtype.byteorder == ">":
        return None
    name = dtype.name.encode("ascii")
    return bytes([len(name)]) + name + bytes([ndim]), _dims(ndim)


def _pack_array(a: np.ndarray) -> msgpack.ExtType:
    head = _array_head(a.dtype, a.ndim)
    if head is None:
        a = a.astype(a.dtype.newbyteorder("<"))
        head = _array_head(a.dtype, a.ndim)
        assert head is not None  # a little-endian dtype has a head
    prefix, dims = head
    # ``ExtType(code, data)`` checks its arguments in Python; these are known good.
    return _new_tuple(msgpack.ExtType, (ARRAY_EXT, prefix + dims.pack(*a.shape) + a.tobytes(order="C")))


def _unpack_array(data: bytes) -> np.ndarray:
    try:
        n = data[0]
        dtype = _dtype_from_name(data[1 : 1 + n].decode("ascii"))
        ndim = data[1 + n]
        dims = _dims(ndim)
        shape = dims.unpack_from(data, 2 + n)
        off = 2 + n + dims.size
    except (IndexError, UnicodeDecodeError, struct.error) as e:
        raise CodecError(f"malformed array in event body: {e}") from None
    count = 1
    for d in shape:
        count *= d
    if len(data) - off != count * dtype.itemsize:
        raise CodecError(
            f"malformed array in event body: shape {shape} of {dtype.name} needs "
            f"{count * dtype.itemsize} bytes, found {len(data) - off}"
        )
    return np.frombuffer(data, dtype=dtype, offset=off).reshape(shape)


def canonical(value: Any) -> Any:
    """``value`` normalised for canonical packing: dicts sorted by key, arrays as extensions."""
    t = type(value)
    if t in _SCALARS:
        return value
    if t is dict:
        for k in value:
            if type(k) is not str:
                raise CodecError(f"cannot encode dict key {k!r} of type {type(k).__name__}: keys must be str")
        out = {}
        for k in sorted(value):
            v = value[k]
            out[k] = v if type(v) in _SCALARS else canonical(v)
        return out
    if t is tuple or t is list:
        return [canonical(v) for v in value]
    if isinstance(value, np.ndarray):
        return _pack_array(value)
    if isinstance(value, np.generic):
        return _pack_array(np.asarray(value))
    if isinstance(value, (str, int, float, bytes)):  # subclasses (e.g. IntEnum, bool is handled)
        base: type = next(b for b in (bool, int, float, str, bytes) if isinstance(value, b))
        return base(value)
    raise CodecError(
        f"cannot encode value of type {t.__name__}: accepted are None, bool, int, float, str, "
        "bytes, tuple/list, dict with str keys and numpy arrays"
    )


def _ext_hook(code: int, data: bytes) -> Any:
    if code == ARRAY_EXT:
        return _unpack_array(data)
    raise CodecError(f"unknown msgpack extension type {code} in event body")


def pack(value: Any) -> bytes:
    """Canonical msgpack bytes of a plain value (see module docstring)."""
    try:
        return msgpack.packb(canonical(value), use_bin_type=True, use_single_float=False)
    except (OverflowError, ValueError, TypeError) as e:
        raise CodecError(f"cannot encode value: {e}") from None


def unpack(data: bytes) -> Any:
    """Inverse of ``pack``: arrays come back as read-only numpy arrays, sequences as tuples."""
    try:
        return msgpack.unpackb(
            data, raw=False, use_list=False, strict_map_key=True, ext_hook=_ext_hook
        )
    except CodecError:
        raise
    except Exception as e:  # msgpack raises several unrelated types for malformed input
        raise CodecError(f"malformed msgpack body: {type(e).__name__}: {e}") from None


_local = threading.local()


def _packer() -> msgpack.Packer:
    """This thread's reusable packer (``packb`` builds a new one per call)."""
    packer = getattr(_local, "packer", None)
    if packer is None:
        packer = _local.packer = msgpack.Packer(use_bin_type=True, use_single_float=False)
    return packer


def pack_fields(names: Sequence[str], fields: Mapping[str, Any], what: str) -> bytes:
    """``pack({name: fields[name] for name in names})`` for ``names`` already sorted, without
    sorting them again and with this thread's reused packer: the encoder's hot path.

    ``what`` names the value in the error raised when it cannot be packed.
    """
    body = {}
    for name in names:
        v = fields[name]
        t = type(v)
        body[name] = v if t in _SCALARS else _pack_array(v) if t is np.ndarray else canonical(v)
    try:
        return _packer().pack(body)
    except (OverflowError, ValueError, TypeError) as e:
        _local.packer = None  # a failed pack may leave bytes in the packer's buffer
        raise CodecError(f"cannot encode {what}: {e}") from None


def pack_values(names: Sequence[str], fields: Mapping[str, Any], what: str) -> bytes:
    """``pack([fields[name] for name in names])`` for ``names`` already sorted, with this thread's
    reused packer: the array of field values that an event body is (``ledger.codec``)."""
    values = []
    for name in names:
        v = fields[name]
        t = type(v)
        values.append(v if t in _SCALARS else _pack_array(v) if t is np.ndarray else canonical(v))
    try:
        return _packer().pack(values)
    except (OverflowError, ValueError, TypeError) as e:
        _local.packer = None  # a failed pack may leave bytes in the packer's buffer
        raise CodecError(f"cannot encode {what}: {e}") from None
