"""Reading a user's or a client's file with a size cap, so ``/dev/zero`` or a huge file is
refused before it fills memory."""

from __future__ import annotations

import os

from verifiers.errors import ConfigError


def read_capped(path: str | os.PathLike, cap: int, what: str) -> bytes:
    """The bytes of ``path``, refusing a file over ``cap`` bytes (``/dev/zero`` included)."""
    try:
        with open(path, "rb") as f:
            data = f.read(cap + 1)
    except OSError as e:
        raise ConfigError(f"cannot read {what} {str(path)!r}: {e.strerror or e}") from None
    if len(data) > cap:
        raise ConfigError(f"{what} {str(path)!r} is larger than {cap} bytes")
    return data
