"""Opening a run directory for replay and audit: its ledger, one run, its parameter store.

Nothing here writes: the ledger is opened read-only; the parameter store
is opened only if its directory exists.
"""

from __future__ import annotations

import dataclasses
import os

from ledger import LedgerError, open_store
from ledger.store import StoredEvent, VerifyReport
from runtime.rundir import RunDir


@dataclasses.dataclass(frozen=True)
class RunLedger:
    """One run's ledger as read from a run directory.

    Attributes:
      directory: the run directory.
      url: the ledger's store URL.
      run_id: the run.
      chain: the hash-chain check of the run.
      events: the run's events in seq order (empty when the chain is corrupt).
      first_bad_kind: the stored kind of the first bad record, when the chain is corrupt.
    """

    directory: str
    url: str
    run_id: str
    chain: VerifyReport
    events: tuple[StoredEvent, ...]
    first_bad_kind: str | None = None


def read_run(directory: str, run_id: str | None = None) -> RunLedger:
    """Verify and read one run of ``DIR/ledger.db`` (or of the ledger ``DIR/ledger.json`` names).

    ``run_id`` may be omitted when the ledger holds exactly one run, or when the directory's
    pointer names it (:meth:`RunDir.select_run`). The events are read only if the hash chain
    verifies: a corrupt ledger cannot be trusted event by event.

    Raises:
      UsageError: ``directory`` is not a run directory, or the run is unknown or ambiguous.
    """
    rundir = RunDir(directory)
    rundir.check_exists()
    with open_store(directory, readonly=True) as store:
        run_id = rundir.select_run(store, run_id)
        chain = store.verify(run_id)
        if chain.ok:
            return RunLedger(directory, store.url, run_id, chain, tuple(store.read(run_id)))
        seq = chain.first_bad_seq or 0
        try:
            bad = next(iter(store.scan(run_id, seq, seq)), None)
        except LedgerError:  # an unreadable record: its kind is unknown too
            bad = None
        return RunLedger(directory, store.url, run_id, chain, (), None if bad is None else bad.kind)


def open_params(url: str):
    """The run's ``ParamStore``, or None when its local directory does not exist."""
    from runtime.params import ParamStore
    from runtime.params.location import parse_location

    directory = parse_location(url).directory
    if directory is not None and not os.path.isdir(directory):
        return None
    return ParamStore.open(url)
