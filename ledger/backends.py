"""``open_store``: the backend a store URL names (memory, SQLite, PostgreSQL), opened.

Each backend is imported when first opened, so ``import ledger`` does not load SQLAlchemy.
"""

from __future__ import annotations

import os

from ledger.errors import LedgerError, StoreUnavailable
from ledger.events import EVENTS, Registry
from ledger.store import EventStore
from ledger.url import ACCEPTED, resolve_url, scheme


def open_store(
    target: str | os.PathLike, *, create: bool = False, readonly: bool = False, registry: Registry = EVENTS,
    synchronous: str = "FULL",
) -> EventStore:
    """Open the store at ``target`` ({accepted}).

    ``synchronous`` is the durability of a SQLite ledger's commits (``PRAGMA synchronous``, one of
    ``SQLITE_SYNCHRONOUS``); the other stores ignore it.

    With ``create=False`` a missing SQLite file is an error and nothing is created; a file or
    database that is not an rlx ledger is refused before anything in it is changed.
    With ``readonly=True`` nothing is ever written (a SQLite file is opened ``mode=ro``, a
    PostgreSQL session is read-only), so reading works on a read-only mount.
    """
    if create and readonly:
        raise LedgerError("a ledger cannot be opened both to create it and read-only")
    url = resolve_url(target)
    kind = scheme(url)
    if kind in ("memory", ":memory:"):
        from ledger.memory import MemoryStore

        return MemoryStore(registry=registry, readonly=readonly)
    if kind == "sqlite":
        from ledger.sql import SqliteStore

        return SqliteStore(url, create=create, readonly=readonly, registry=registry, synchronous=synchronous)
    if kind in ("postgresql", "postgres", "postgresql+psycopg"):
        from ledger.sql import PostgresStore

        return PostgresStore(url, create=create, readonly=readonly, registry=registry)
    raise StoreUnavailable(f"unsupported ledger URL scheme {kind!r} in {url!r}; accepted: {ACCEPTED}")


open_store.__doc__ = (open_store.__doc__ or "").format(accepted=ACCEPTED)
