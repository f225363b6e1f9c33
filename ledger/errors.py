"""Errors of the ledger package.

Every ledger failure is a ``LedgerError``; driver errors are translated at the store boundary
(``raise LedgerError(...) from e``). ``retryable`` says whether the same call may succeed later
without any change by the caller (a busy database), as opposed to a decision the caller must
revisit (a conflict, a fence) or a broken store.
"""

from __future__ import annotations


class LedgerError(Exception):
    """Base class of ledger errors."""

    retryable = False


class CodecError(LedgerError):
    """An event or body that cannot be encoded or decoded (unknown kind, malformed body)."""


class AppendConflict(LedgerError):
    """The run's head is not where the appender expected it; nothing was written."""

    def __init__(self, run_id: str, expected_seq: int, actual_seq: int):
        super().__init__(
            f"append conflict on run {run_id!r}: expected head seq {expected_seq}, "
            f"found {actual_seq}; nothing was written"
        )
        self.run_id = run_id
        self.expected_seq = expected_seq
        self.actual_seq = actual_seq


class Fenced(LedgerError):
    """The writer's epoch is stale: a newer writer owns the run; nothing was written."""

    def __init__(self, run_id: str, epoch: int, current_epoch: int):
        super().__init__(
            f"writer fenced on run {run_id!r}: epoch {epoch} is stale, the run's writer epoch is "
            f"{current_epoch}; nothing was written"
        )
        self.run_id = run_id
        self.epoch = epoch
        self.current_epoch = current_epoch


class RunNotFound(LedgerError):
    """The store holds no run with this id."""

    def __init__(self, run_id: str, known: list[str]):
        shown = ", ".join(repr(r) for r in known[:10]) or "none"
        more = f" (and {len(known) - 10} more)" if len(known) > 10 else ""
        super().__init__(f"no run {run_id!r} in this ledger; runs present: {shown}{more}")
        self.run_id = run_id


class RunExists(LedgerError):
    """A run with this id already exists."""


class StoreUnavailable(LedgerError):
    """The store cannot be opened or reached (bad path, bad URL, not a ledger, server down)."""


class ReadOnlyStore(LedgerError):
    """A write on a store opened read-only (``open_store(..., readonly=True)``); nothing was written."""


class Busy(LedgerError):
    """The database stayed locked past the busy timeout; the same call may succeed later."""

    retryable = True


class CorruptLedger(LedgerError):
    """The stored history fails verification; ``seq`` names the first bad event."""

    def __init__(self, run_id: str, seq: int, reason: str):
        super().__init__(f"ledger corrupt: run {run_id!r}, seq {seq}: {reason}")
        self.run_id = run_id
        self.seq = seq
        self.reason = reason
