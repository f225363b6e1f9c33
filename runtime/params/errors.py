"""Errors of the parameter server."""

from __future__ import annotations

from runtime.errors import RlxError


class ParamStoreError(RlxError):
    """A parameter-store failure: bad URL, unknown version, unreadable or corrupt data."""


class DigestMismatch(ParamStoreError):
    """Stored bytes do not hash to the digest recorded when the version was published.

    Attributes:
        version: the version being read.
        leaf: the path of the first leaf whose bytes differ, or ``None`` when every leaf
            matches its own record but the records do not combine to the version digest.
    """

    def __init__(self, message: str, *, version: int, leaf: str | None) -> None:
        super().__init__(message)
        self.version = version
        self.leaf = leaf
