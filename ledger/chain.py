"""The hash chain over a run's events.

``digest(seq) = sha256(prev_digest ‖ u32 len(kind) ‖ kind ‖ u32 version ‖ u64 len(body) ‖ body)``
with ``prev_digest`` of the first event being 32 zero bytes. Lengths frame every part so no two
different records hash the same input. A flipped bit anywhere changes every later digest; the
head digest names the whole history.
"""

from __future__ import annotations

import hashlib
import struct

GENESIS = bytes(32)
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


def link(prev: bytes, kind: str, version: int, body: bytes) -> bytes:
    """The digest of one record given the digest of the record before it."""
    k = kind.encode("utf-8")
    h = hashlib.sha256(prev)
    h.update(_U32.pack(len(k)))
    h.update(k)
    h.update(_U32.pack(version))
    h.update(_U64.pack(len(body)))
    h.update(body)
    return h.digest()
