"""Where a ledger is: a store URL from what a user names (a URL, a SQLite file path, a directory).

The ledger knows no directory layout. A directory names a ledger only through the resolver the
application that lays directories out installs (``runtime.rundir`` installs one for run
directories when it is imported); without one, a directory is taken as a SQLite file path, which
the SQLite store refuses in one line.
"""

from __future__ import annotations

import os
from collections.abc import Callable

ACCEPTED = "a SQLite file path, a run directory, sqlite:///PATH, postgresql://… or memory://"

DirectoryResolver = Callable[[str], str]
"""``directory -> where its ledger is`` (a store URL or a SQLite file path)."""

_directory_resolver: DirectoryResolver | None = None


def resolve_directories(resolver: DirectoryResolver | None) -> None:
    """Let ``resolve_url`` take a directory: ``resolver(directory)`` names its ledger (None: stop)."""
    global _directory_resolver
    _directory_resolver = resolver


def resolve_url(target: str | os.PathLike) -> str:
    """The store URL of ``target``: a URL as given, a SQLite file path as ``sqlite:///ABSPATH``, a
    directory as the ledger the installed resolver (``resolve_directories``) names."""
    t = os.fspath(target)
    if "://" in t or t == ":memory:":
        return t
    if _directory_resolver is not None and os.path.isdir(t):
        t = _directory_resolver(t)
        if "://" in t:
            return t
    return "sqlite:///" + os.path.abspath(t)


def scheme(url: str) -> str:
    """The scheme of store URL ``url``, lower-case (``":memory:"`` for that special name)."""
    return url.split("://", 1)[0].lower() if "://" in url else url
