"""Content digests of pytrees of arrays: what I8 compares ("each digest matches the weights").

The digest names a tree's leaf paths, dtypes, shapes and element bytes, and nothing else: it
does not depend on dict insertion order, on the process, on the array library (numpy or JAX)
or on the device. Byte layout, all integers little-endian:

    data(leaf)   = the elements in C order, each as its little-endian bytes
                   (bool: one byte 0x00 or 0x01; bfloat16: the upper two bytes of a float32)
    record(leaf) = u32(len(path)) ‖ path ‖ u32(len(dtype)) ‖ dtype ‖ u32(ndim)
                   ‖ u64(dim_0) ‖ … ‖ u64(dim_{ndim-1}) ‖ sha256(data(leaf))
    digest       = sha256("rlx.params.sha256.v1\\n" ‖ u64(n) ‖ record(leaf_1) ‖ … ‖ record(leaf_n))

where ``path`` is the ASCII leaf path of ``runtime.params.tree``, ``dtype`` the ASCII dtype name
(``float32``, ``bfloat16``, …), and the records are sorted by path bytes. The digest is the
lower-case hex of the final sha256. Hashing every leaf on its own (a two-level hash rather than
one stream) lets a reader name the leaf whose bytes went bad, and hashes each byte once.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import math
import os
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from runtime.params.errors import ParamStoreError
from runtime.params.tree import flatten

DIGEST_DOMAIN = b"rlx.params.sha256.v1\n"

_PARALLEL_BYTES = 8 << 20  # below this, thread start-up costs more than it saves

SUPPORTED_DTYPES: tuple[str, ...] = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "float8_e4m3fn",
    "float8_e5m2",
    "complex64",
    "complex128",
)

_ML_DTYPES = {
    "bfloat16": ml_dtypes.bfloat16,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
}


def numpy_dtype(name: str) -> np.dtype:
    """The little-endian numpy dtype of a supported dtype name."""
    if name not in SUPPORTED_DTYPES:
        raise ParamStoreError(
            f"dtype {name!r} is not supported; accepted: {', '.join(SUPPORTED_DTYPES)}"
        )
    return np.dtype(_ML_DTYPES.get(name, name)).newbyteorder("<")


@dataclass(frozen=True)
class LeafRecord:
    """What the digest knows of one leaf: its path, dtype name, shape and data hash."""

    path: str
    dtype: str
    shape: tuple[int, ...]
    sha256: str

    @property
    def nbytes(self) -> int:
        """The bytes of the leaf's elements."""
        return numpy_dtype(self.dtype).itemsize * math.prod(self.shape)

    def encode(self) -> bytes:
        """The leaf's record bytes (see the module docstring)."""
        path, dtype = self.path.encode("ascii"), self.dtype.encode("ascii")
        return b"".join(
            (
                struct.pack("<I", len(path)),
                path,
                struct.pack("<I", len(dtype)),
                dtype,
                struct.pack(f"<I{len(self.shape)}Q", len(self.shape), *self.shape),
                bytes.fromhex(self.sha256),
            )
        )


def canonical(path: str, array: Any) -> np.ndarray:
    """``array`` as a C-contiguous little-endian numpy array of a supported dtype."""
    array = np.asarray(array)
    if array.dtype.name not in SUPPORTED_DTYPES:
        raise ParamStoreError(
            f"leaf {path!r} has dtype {array.dtype.name!r}; accepted: {', '.join(SUPPORTED_DTYPES)}"
        )
    # np.asarray, not np.ascontiguousarray, which turns 0-d arrays into 1-d ones.
    return np.asarray(array, dtype=array.dtype.newbyteorder("<"), order="C")


def data_sha256(array: np.ndarray) -> str:
    """sha256 of a canonical array's element bytes, as hex."""
    return hashlib.sha256(array.reshape(-1).view(np.uint8).data).hexdigest()


def data_sha256s(arrays: Sequence[np.ndarray]) -> list[str]:
    """``data_sha256`` of each array, hashed on several threads for large trees.

    hashlib releases the GIL while hashing, so leaves hash in parallel; the result does not
    depend on the number of threads.
    """
    if sum(a.nbytes for a in arrays) < _PARALLEL_BYTES or len(arrays) < 2:
        return [data_sha256(a) for a in arrays]
    workers = min(len(arrays), os.cpu_count() or 1, 8)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(data_sha256, arrays))


def leaf_records(leaves: Sequence[tuple[str, np.ndarray]]) -> tuple[LeafRecord, ...]:
    """The records of canonical arrays keyed by leaf path, in the given order."""
    hashes = data_sha256s([array for _, array in leaves])
    return tuple(
        LeafRecord(path, array.dtype.name, tuple(array.shape), sha)
        for (path, array), sha in zip(leaves, hashes, strict=True)
    )


def combine(records: Iterable[LeafRecord]) -> str:
    """The digest of a tree given the records of its leaves, in any order."""
    ordered = sorted(records, key=lambda r: r.path.encode("ascii"))
    h = hashlib.sha256(DIGEST_DOMAIN)
    h.update(struct.pack("<Q", len(ordered)))
    for record in ordered:
        h.update(record.encode())
    return h.hexdigest()


def canonical_leaves(tree: Any) -> tuple[tuple[str, np.ndarray], ...]:
    """The (leaf path, canonical array) pairs of ``tree``, in JAX flattening order."""
    return tuple((path, canonical(path, array)) for path, array in flatten(tree))


def params_digest(tree: Any) -> str:
    """The content digest of a pytree of arrays (see the module docstring for the layout).

    Works without a store: the trainer and replay use it to compare weights bit for bit.
    """
    return combine(leaf_records(canonical_leaves(tree)))
