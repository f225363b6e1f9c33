"""A run directory: where a run's ledger and parameters live, and which run it means.

``rlx run --out DIR`` writes ``DIR/ledger.db`` (or, when ``ledger.url`` names another store,
``DIR/ledger.json`` pointing to it and to the run), ``DIR/params/`` (unless ``params.url`` names
another parameter store), ``summary.json`` and ``report.png``. Resume, replay, audit and the
ledger tools all find a run's parts through :class:`RunDir`, so the rules live here once.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ledger.store import RUN_LEDGER_FILE, RUN_POINTER_FILE, directory_pointer, write_run_pointer
from runtime.errors import UsageError

PARAMS_DIR = "params"


def run_started(store, run_id: str):
    """The ``RunStarted`` that opens ``run_id`` in ``store`` (its config, seed and stack), or a
    one-line refusal when the run's first event is missing, unreadable or something else."""
    from ledger import events as ev
    from ledger.errors import CodecError

    try:
        first = next(store.read(run_id, 1, 1)).event
    except (StopIteration, CodecError):
        first = None
    if not isinstance(first, ev.RunStarted):
        raise UsageError(f"run {run_id!r} does not start with RunStarted")
    return first


def _listed(runs: Sequence[str]) -> str:
    return ", ".join(repr(r) for r in runs[:10]) or "none"


@dataclasses.dataclass(frozen=True)
class RunDir:
    """The run directory ``path``."""

    path: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", os.fspath(self.path))

    @property
    def ledger(self) -> str:
        """Where the run's ledger is: the URL ``ledger.json`` names, else ``DIR/ledger.db``."""
        pointer = directory_pointer(self.path)
        return os.path.join(self.path, RUN_LEDGER_FILE) if pointer is None else pointer["url"]

    @property
    def pointed_run(self) -> str | None:
        """The run ``ledger.json`` names (its ledger may hold other runs), or None."""
        pointer = directory_pointer(self.path)
        return None if pointer is None else pointer["run_id"]

    def check_creatable(self) -> None:
        """Raise ``UsageError`` unless ``path`` is a directory or can be made one (its nearest
        existing ancestor is a writable directory). Creates nothing."""
        path = os.path.abspath(self.path)
        if os.path.exists(path):
            if not os.path.isdir(path):
                raise UsageError(f"--out {self.path!r} exists and is not a directory")
            return
        parent = os.path.dirname(path)
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            raise UsageError(f"--out {self.path!r} cannot be created: {parent!r} is not a directory")
        if not os.access(parent, os.W_OK):
            raise UsageError(f"--out {self.path!r} cannot be created: {parent!r} is not writable")

    def check_exists(self) -> None:
        """Raise ``UsageError`` unless ``path`` is a run directory (a ledger or a pointer to one)."""
        if not os.path.isdir(self.path):
            raise UsageError(f"{self.path!r} is not a run directory (a directory holding {RUN_LEDGER_FILE})")
        if directory_pointer(self.path) is None and not os.path.isfile(os.path.join(self.path, RUN_LEDGER_FILE)):
            raise UsageError(f"{self.path!r} is not a run directory: it has no {RUN_LEDGER_FILE} "
                             f"(nor a {RUN_POINTER_FILE} naming its ledger)")

    def select_run(self, store, run_id: str | None = None) -> str:
        """The run meant: ``run_id``, else the pointer's run, else the ledger's only run.

        Raises:
          UsageError: the run is not in the ledger, or none is named and the ledger holds
            several (or none).
        """
        runs = store.runs()
        run_id = run_id or self.pointed_run
        if run_id is None:
            if len(runs) != 1:
                raise UsageError(f"{self.ledger} holds {len(runs)} runs ({_listed(runs)}); pick one with --run")
            return runs[0]
        if run_id not in runs:
            raise UsageError(f"--run {run_id!r}: no such run in {self.ledger}; runs present: {_listed(runs)}")
        return run_id

    def params(self, url: str | None) -> str:
        """The run's parameter store: ``url`` (its ``params.url``) if set, else ``DIR/params``."""
        return url or os.path.join(self.path, PARAMS_DIR)

    def logged_params(self, config: Mapping[str, Any]) -> str:
        """The parameter store of the run whose logged config (``RunStarted``) is ``config``."""
        return self.params((config.get("params") or {}).get("url"))

    def new_ledger(self, url: str | None) -> str:
        """Where a new run writes its ledger: ``url`` (its ``ledger.url``) if set, else
        ``DIR/ledger.db``."""
        return url or os.path.join(self.path, RUN_LEDGER_FILE)

    def point_to(self, url: str, run_id: str) -> None:
        """Record that this directory's run is ``run_id`` of the ledger at ``url``."""
        write_run_pointer(self.path, url, run_id)


__all__ = ["PARAMS_DIR", "RunDir"]
