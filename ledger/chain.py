"""The hash chain over a run's events.

``digest(seq) = sha256(prev_digest ‖ u32 len(kind) ‖ kind ‖ u32 version ‖ u64 len(body) ‖ body)``
with ``prev_digest`` of the first event being 32 zero bytes. Lengths frame every part so no two
different records hash the same input. A flipped bit anywhere changes every later digest; the
head digest names the whole history.
"""

from __future__ import annotations

import functools
import hashlib
import struct

GENESIS = bytes(32)
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_sha256 = hashlib.sha256


@functools.lru_cache(maxsize=1024)
def _head(kind: str, version: int) -> bytes:
    k = kind.encode("utf-8")
    return _U32.pack(len(k)) + k + _U32.pack(version)


def link(prev: bytes, kind: str, version: int, body: bytes) -> bytes:
    """The digest of one record given the digest of the record before it."""
    h = _sha256(prev)  # incremental updates: cheaper than concatenating the parts first
    h.update(_head(kind, version))
    h.update(_U64.pack(len(body)))
    h.update(body)
    return h.digest()
