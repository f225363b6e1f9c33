"""How a SQLite ledger file is opened without changing it: the checks made before SQLite touches
the file, and the URI a read-only connection uses.

SQLite writes as a side effect of opening: a 0-byte file gets a database header as soon as a
pragma such as ``journal_mode`` runs, and ``journal_mode=WAL`` rewrites a foreign database's
header for good. So a file that is to be opened without ``create`` is first read as plain bytes
here, and only a SQLite database is handed to SQLite.

A read-only connection (``mode=ro``) of a WAL database still needs the ``-shm`` index next to it.
In a writable directory SQLite creates it; in a read-only one (a read-only mount) it cannot:
  - with both ``-wal`` and ``-shm`` present (a live writer's, or a crashed writer's left behind),
    ``mode=ro`` reads them without writing (SQLite builds a private index when the ``-shm`` is
    unusable), so no writer is ever needed;
  - with no ``-wal``, or an empty one, the file alone holds every commit: ``immutable=1`` reads
    it without the ``-shm`` and without locks (nothing can write through a read-only directory);
  - a non-empty ``-wal`` without its ``-shm`` holds commits SQLite can only read by writing a new
    ``-shm``: refused, since ``immutable=1`` would silently drop them.
"""

from __future__ import annotations

import os
import urllib.parse

from ledger.errors import StoreUnavailable

SQLITE_HEADER = b"SQLite format 3\x00"
EXPECTED = ("expected an rlx ledger (a SQLite file or PostgreSQL database holding the rlx_meta, rlx_runs "
            "and rlx_events tables that `rlx run` writes)")


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def check_database_file(path: str) -> None:
    """Raise ``StoreUnavailable`` unless ``path`` starts as a SQLite database; reads 16 bytes.

    An empty file counts as one only beside a non-empty ``-wal`` (a database whose first commits
    were never checkpointed).
    """
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError as e:
        raise StoreUnavailable(f"cannot read ledger {path}: {e.strerror}") from None
    if not head:
        if _size(path + "-wal") > 0:
            return
        raise StoreUnavailable(f"{path} is not an rlx ledger: it is an empty file; {EXPECTED}")
    if head != SQLITE_HEADER:
        raise StoreUnavailable(f"{path} is not an rlx ledger: it is not a SQLite database; {EXPECTED}")


def writable_uri(path: str, *, create: bool) -> str:
    """The URI of a read-write connection (``mode=rwc`` creates a missing file)."""
    return "file:" + urllib.parse.quote(path) + ("?mode=rwc" if create else "?mode=rw")


def readonly_uri(path: str) -> str:
    """The URI of a connection that never writes ``path`` nor creates anything next to it where
    it cannot (see the module docstring)."""
    uri = "file:" + urllib.parse.quote(path) + "?mode=ro"
    if os.access(os.path.dirname(path) or ".", os.W_OK):
        return uri
    wal, shm = path + "-wal", path + "-shm"
    if os.path.exists(wal) and os.path.exists(shm):
        return uri
    if _size(wal) == 0:
        return uri + "&immutable=1"
    raise StoreUnavailable(
        f"cannot read ledger {path} in a read-only directory: its write-ahead log {wal} holds commits "
        f"that SQLite reads only through an index {shm}, which is missing and cannot be created there; "
        "copy the run directory to a writable place and read the copy")
