"""A run directory: where a run's ledger and parameters live, and which run it means.

``rlx run --out DIR`` writes ``DIR/ledger.db`` (or, when ``ledger.url`` names another store,
``DIR/ledger.json`` pointing to it and to the run), ``DIR/params/`` (unless ``params.url`` names
another parameter store), ``summary.json`` and ``report.png``. Resume, replay, audit and the
ledger tools all find a run's parts through :class:`RunDir`, so the rules live here once. The
ledger knows no run directory: importing this module lets ``ledger.open_store`` take one
(``ledger.url.resolve_directories``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ledger.errors import StoreUnavailable
from ledger.url import resolve_directories, resolve_url
from runtime.errors import UsageError

RUN_LEDGER_FILE = "ledger.db"
RUN_POINTER_FILE = "ledger.json"
"""In a run directory whose ledger lives elsewhere (a PostgreSQL URL, another file): where it is."""
PARAMS_DIR = "params"


def run_pointer(directory: str | os.PathLike) -> dict | None:
    """``{"url", "run_id"}`` of ``DIR/ledger.json`` (a run whose ledger is not ``DIR/ledger.db``),
    or None when the directory has no pointer."""
    path = os.path.join(os.fspath(directory), RUN_POINTER_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        url, run_id = doc["url"], doc["run_id"]
        if not (isinstance(url, str) and "://" in url and isinstance(run_id, str)):
            raise ValueError("url must be a store URL and run_id a string")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise StoreUnavailable(f"{path} does not point to a ledger: {e}") from None
    return {"url": url, "run_id": run_id}


def directory_pointer(target: str | os.PathLike) -> dict | None:
    """The pointer ``target`` resolves through: ``run_pointer`` of a run directory that has no
    ``ledger.db`` of its own (which takes precedence); None for anything else."""
    t = os.fspath(target)
    if "://" in t or not os.path.isdir(t) or os.path.exists(os.path.join(t, RUN_LEDGER_FILE)):
        return None
    return run_pointer(t)


def pointed_run(target: str | os.PathLike) -> str | None:
    """The run id a run directory's pointer names, when ``target`` resolves through one."""
    pointer = directory_pointer(target)
    return None if pointer is None else pointer["run_id"]


def write_run_pointer(directory: str | os.PathLike, target: str, run_id: str) -> None:
    """Record in run directory ``directory`` that run ``run_id`` is in the ledger at ``target``."""
    path = os.path.join(os.fspath(directory), RUN_POINTER_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"url": resolve_url(target), "run_id": run_id}, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


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


@dataclasses.dataclass(frozen=True)
class LoggedRun:
    """What a run's ledger says it runs with: its ``RunStarted`` and, for a fork
    (``runtime.fork``), each ``RunForked`` with its seq, oldest first. A fork's settings are its
    newest ``RunForked``'s; its stack is the ``RunStarted`` one's."""

    started: Any
    forks: tuple[tuple[int, Any], ...] = ()

    @property
    def config(self) -> dict:
        """The resolved config (a dict) the run runs with now."""
        return self.forks[-1][1].config if self.forks else self.started.config

    @property
    def fingerprint(self) -> dict:
        """``RunStarted``'s fingerprint, its input files those of the newest fork."""
        if not self.forks:
            return self.started.fingerprint
        return {**self.started.fingerprint, "inputs": self.forks[-1][1].inputs}

    def config_at(self, seq: int) -> dict:
        """The config the run ran with at ``seq``: that of the newest ``RunForked`` before it."""
        config = self.started.config
        for at, fork in self.forks:
            if at < seq:
                config = fork.config
        return config


def logged_run(store, run_id: str) -> LoggedRun:
    """The :class:`LoggedRun` of ``run_id`` in ``store`` (only its ``RunStarted`` and
    ``RunForked`` records are read)."""
    from ledger import events as ev
    from ledger.codec import decode_body

    started = run_started(store, run_id)
    forks = tuple((r.seq, decode_body(r.kind, r.version, r.body, store.registry))
                  for _, r in store.scan_linked(run_id, [ev.RunForked.KIND]))
    return LoggedRun(started, forks)


def check_creatable(path: str | os.PathLike, flag: str, *, directory: bool = True) -> None:
    """Raise ``UsageError`` (naming ``flag``) unless ``path`` can be written: not a symbolic link
    (whose target the user did not name), an existing directory (with ``directory``; a file
    otherwise, which the caller decides about) or a new path whose nearest existing ancestor is a
    directory that takes new entries. That is probed by making and removing one, so a read-only
    mount or a pseudo file system (``/proc``) is found now, by root too. Creates nothing."""
    import tempfile

    shown = os.fspath(path)
    path = os.path.abspath(shown)
    if os.path.islink(path):
        raise UsageError(f"{flag} {shown!r} is a symbolic link (to {os.readlink(path)!r}); give the path itself")
    if os.path.exists(path):
        if directory and not os.path.isdir(path):
            raise UsageError(f"{flag} {shown!r} exists and is not a directory")
        if not os.path.isdir(path):
            return
        parent = path
    else:
        parent = os.path.dirname(path)
        while not os.path.lexists(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            raise UsageError(f"{flag} {shown!r} cannot be created: {parent!r} is not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".rlx-probe-", dir=parent))
    except OSError as e:
        where = "it" if parent == path else repr(parent)
        raise UsageError(f"{flag} {shown!r} cannot be written: {where} takes no new files ({e.strerror})") from None


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
        """Raise ``UsageError`` unless ``path`` is a directory or can be made one (see
        :func:`check_creatable`). Creates nothing."""
        check_creatable(self.path, "--out")

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


def _ledger_of(directory: str) -> str:
    return RunDir(directory).ledger


# A run directory given where a ledger is expected (``rlx ledger verify DIR``, ``open_store(DIR)``)
# names the ledger ``RunDir.ledger`` says.
resolve_directories(_ledger_of)

__all__ = ["PARAMS_DIR", "RUN_LEDGER_FILE", "RUN_POINTER_FILE", "LoggedRun", "RunDir", "check_creatable",
           "directory_pointer", "logged_run", "pointed_run", "run_pointer", "run_started", "write_run_pointer"]
