"""Opening a run directory for replay and audit: its ledger, one run, its parameter store.

Nothing here writes: the ledger is opened read-only; the parameter store
is opened only if its directory exists.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from ledger import LedgerError, open_store
from ledger.store import RUN_LEDGER_FILE, RUN_POINTER_FILE, StoredEvent, VerifyReport, directory_pointer
from runtime.errors import UsageError


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
    pointer names it. The events are read only if
    the hash chain verifies: a corrupt ledger cannot be trusted event by event.

    Raises:
      UsageError: ``directory`` is not a run directory, or the run is unknown or ambiguous.
    """
    if not os.path.isdir(directory):
        raise UsageError(f"{directory!r} is not a run directory (a directory holding {RUN_LEDGER_FILE})")
    pointer = directory_pointer(directory)
    if pointer is None:
        path = os.path.join(directory, RUN_LEDGER_FILE)
        if not os.path.isfile(path):
            raise UsageError(f"{directory!r} is not a run directory: it has no {RUN_LEDGER_FILE} "
                             f"(nor a {RUN_POINTER_FILE} naming its ledger)")
    else:
        path, run_id = pointer["url"], run_id or pointer["run_id"]
    with open_store(directory, readonly=True) as store:
        runs = store.runs()
        if run_id is None:
            if len(runs) != 1:
                listed = ", ".join(repr(r) for r in runs[:10]) or "none"
                raise UsageError(f"{path} holds {len(runs)} runs ({listed}); pick one with --run")
            run_id = runs[0]
        elif run_id not in runs:
            listed = ", ".join(repr(r) for r in runs[:10]) or "none"
            raise UsageError(f"--run {run_id!r}: no such run in {path}; runs present: {listed}")
        chain = store.verify(run_id)
        if chain.ok:
            return RunLedger(directory, store.url, run_id, chain, tuple(store.read(run_id)))
        seq = chain.first_bad_seq or 0
        try:
            bad = next(iter(store.scan(run_id, seq, seq)), None)
        except LedgerError:  # an unreadable record: its kind is unknown too
            bad = None
        return RunLedger(directory, store.url, run_id, chain, (), None if bad is None else bad.kind)


def params_url(directory: str, config: Mapping[str, Any]) -> str:
    """The run's parameter store: ``params.url`` of its logged config, else ``DIR/params``."""
    url = (config.get("params") or {}).get("url")
    return url or os.path.join(directory, "params")


def open_params(url: str):
    """The run's ``ParamStore``, or None when its local directory does not exist."""
    from runtime.params import ParamStore
    from runtime.params.location import parse_location

    directory = parse_location(url).directory
    if directory is not None and not os.path.isdir(directory):
        return None
    return ParamStore.open(url)
