"""Where a parameter store lives: a URL or a local path, parsed into a TensorStore kvstore."""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass
from typing import Any

from runtime.params.errors import ParamStoreError

ACCEPTED = "file:///absolute/path, memory://name, or a local directory path"


@dataclass(frozen=True)
class Location:
    """A store root: a TensorStore kvstore driver and a path ending in ``/`` (or empty).

    ``directory`` is the local directory of a ``file`` store, ``None`` for memory.
    """

    url: str
    driver: str
    path: str

    @property
    def directory(self) -> str | None:
        if self.driver != "file":
            return None
        return self.path.rstrip("/") or "/"

    def kvstore(self, key: str = "") -> dict[str, Any]:
        """The kvstore spec of ``key`` below the root (a prefix when it ends in ``/``)."""
        return {"driver": self.driver, "path": self.path + key}


def _with_slash(path: str) -> str:
    return path if not path or path.endswith("/") else path + "/"


def parse_location(url: str) -> Location:
    """Parse a store URL.

    ``file:///abs/dir`` and plain paths (made absolute against the working directory) name a
    local directory; ``memory://name`` names an in-memory store shared by every ``ParamStore``
    of the process that uses the same TensorStore context. Percent-escapes in URLs are decoded.
    """
    if not isinstance(url, str) or not url:
        raise ParamStoreError(f"parameter store URL {url!r} is not accepted; use {ACCEPTED}")
    scheme, sep, rest = url.partition("://")
    if not sep:
        return Location(url, "file", _with_slash(os.path.abspath(url)))
    scheme = scheme.lower()
    if scheme == "file":
        path = urllib.parse.unquote(rest)
        if path.startswith("localhost/"):
            path = path[len("localhost") :]
        if not path.startswith("/"):
            raise ParamStoreError(
                f"parameter store URL {url!r} does not hold an absolute path; "
                f"use file:///absolute/path"
            )
        return Location(url, "file", _with_slash(os.path.normpath(path)))
    if scheme == "memory":
        return Location(url, "memory", _with_slash(urllib.parse.unquote(rest)))
    raise ParamStoreError(
        f"parameter store URL scheme {scheme!r} in {url!r} is not supported; use {ACCEPTED}"
    )
