"""Starts a run's worker processes, notices at once when one dies, and starts it again.

Each worker slot (``inference-0``, ``verifier-0``, ``trainer-0``…) runs one ``rlx worker ROLE``
child at a time; the n-th child of a slot joins as ``SLOT.n``. The supervisor polls its children
(``poll``, called by the run's watch loop a few times a second): a child that exited or was
killed is reaped, its loss is recorded in the ledger at once (``lose``: its leases and hand-outs go
back without waiting for the lease timeout), and the slot is started again — at once if the dead
child had delivered work, else after a doubling back-off. A child that exited with status 0 saw
the run finish: it is neither lost nor started again. A slot whose children die
``MAX_FAILURES`` times in a row without delivering anything stops the run with a one-line reason.

A trainer gang (``workers.trainer_processes`` > 1, ``runtime.trainer.gang``) is one slot of P
children, ranks 0 to P-1 joined with ``jax.distributed`` through a coordinator on a Unix socket in
a fresh directory only this user can enter (``private_coordinator``: the coordinator has no
authentication, so no other user's process may reach it); only rank 0 joins the controller. The
gang is one failure domain: when any rank dies the supervisor kills the others and starts the
whole gang again (a rank cannot rejoin a live gang); it has finished when every rank has exited 0.

``workers.jsonl`` in the run directory records each start (with the devices the child was shown),
exit and first accepted submission with its wall time (for people and ``scripts/chaos.py``; nothing decides on it), and each child's output
goes to ``logs/WORKER_ID.log``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence

MAX_FAILURES = 5
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 10.0
STOP_GRACE_S = 5.0
RETRY_FOR_S = 60.0


def rlx_command() -> list[str]:
    """How to start ``rlx``: the console script next to this interpreter, else ``python -m``."""
    script = os.path.join(os.path.dirname(sys.executable), "rlx")
    if os.path.isfile(script) and os.access(script, os.X_OK):
        return [sys.executable, script]
    found = shutil.which("rlx")
    return [found] if found else [sys.executable, "-m", "runtime.cli"]


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class Journal:
    """Appends one JSON object per line, with the wall time (never read by anything that decides)."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()

    def write(self, event: str, **fields) -> None:
        line = json.dumps({"t": time.time(), "event": event, **fields}, sort_keys=True)
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def private_coordinator() -> tuple[str, str]:
    """A gang's coordinator address that only this user's processes can reach, and its directory
    (to remove once the gang has ended): ``unix:DIR/coordinator.sock``, DIR made with mode 700.

    Raises:
        UsageError: the temporary directory's path is too long for a Unix socket (names ``TMPDIR``).
    """
    from runtime.errors import UsageError
    from runtime.trainer.gang import MAX_SOCKET_PATH

    directory = tempfile.mkdtemp(prefix="rlx-gang-")
    path = os.path.join(directory, "coordinator.sock")
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        os.rmdir(directory)
        raise UsageError(f"a trainer gang's socket {path} is longer than a Unix socket's {MAX_SOCKET_PATH} bytes; "
                         "set TMPDIR to a shorter directory (e.g. TMPDIR=/tmp)")
    return f"unix:{path}", directory


class _Slot:
    def __init__(self, name: str, role: str, processes: int = 1):
        self.name, self.role = name, role
        self.processes = processes  # more than 1: a gang, restarted whole
        self.peers: list[subprocess.Popen] = []  # ranks 1.. of a gang
        self.coordinator_dir = ""  # the gang's private socket directory
        self.spawns = 0
        self.failures = 0  # deaths in a row without delivered work
        self.proc: subprocess.Popen | None = None
        self.worker_id = ""
        self.log_path = ""
        self.delivered = False
        self.restart_at = 0.0
        self.finished = False  # its last child exited 0: the run has finished


class Supervisor:
    """Runs ``count`` workers of each role against the controller at ``target``.

    Args:
        target: the controller's ``HOST:PORT``.
        roles: ``(role, count)`` pairs.
        log_dir: where each child's output goes.
        journal: where starts, exits and first deliveries are recorded.
        lose: records that workers are gone (``ControllerLoop.lose``); called with every id a
            dead child may have joined under.
        joined_ids: the ids now joined (to find a child's rejoins, ``ID~N``).
        env: extra environment for the children (the run's token).
        retry_for_s: how long a child goes on calling a controller that does not answer.
        gangs: role → processes per worker of that role (a gang when more than 1).
        placed: (slot name, rank) → the environment entries that show that child only its
            devices (``runtime.placement.Layout.env``); the same for every child of a slot, so a
            restarted worker gets the devices of the one it replaces.
    """

    def __init__(self, target: str, roles: Sequence[tuple[str, int]], *, log_dir: str, journal: Journal,
                 lose: Callable[[Iterable[str], str], object], joined_ids: Callable[[], Iterable[str]],
                 env: dict[str, str] | None = None, max_failures: int = MAX_FAILURES,
                 retry_for_s: float = RETRY_FOR_S, gangs: dict[str, int] | None = None,
                 placed: Callable[[str, int], dict[str, str]] | None = None):
        self.target = target
        gangs = gangs or {}
        self.slots = [_Slot(f"{role}-{i}", role, gangs.get(role, 1)) for role, count in roles for i in range(count)]
        self.log_dir = log_dir
        self.journal = journal
        self.lose = lose
        self.joined_ids = joined_ids
        self.env = {**os.environ, **(env or {})}
        self.placed = placed or (lambda slot, rank: {})
        self.max_failures = max_failures
        self.retry_for_s = retry_for_s
        self.failure: str | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        os.makedirs(self.log_dir, exist_ok=True)
        for slot in self.slots:
            self._spawn(slot)

    def _spawn(self, slot: _Slot) -> None:
        slot.spawns += 1
        slot.worker_id = f"{slot.name}.{slot.spawns}"
        slot.delivered = False
        slot.log_path = os.path.join(self.log_dir, f"{slot.worker_id}.log")
        argv = [*rlx_command(), "worker", slot.role, "--controller", self.target, "--worker-id", slot.worker_id,
                "--retry-for", str(self.retry_for_s), "--exit-with-parent"]
        if slot.processes == 1:
            placed = self.placed(slot.name, 0)
            slot.proc = self._start(argv, slot.log_path, placed)
            self.journal.write("spawn", slot=slot.name, role=slot.role, worker_id=slot.worker_id, pid=slot.proc.pid,
                               **_devices(placed))
            return
        coordinator, slot.coordinator_dir = private_coordinator()
        procs = []
        for rank in range(slot.processes):
            log_path = slot.log_path if rank == 0 else os.path.join(self.log_dir, f"{slot.worker_id}.rank{rank}.log")
            placed = self.placed(slot.name, rank)
            procs.append(self._start([*argv, "--gang", f"{rank}/{slot.processes}", "--coordinator", coordinator],
                                     log_path, placed))
            self.journal.write("spawn", slot=slot.name, role=slot.role, worker_id=slot.worker_id, rank=rank,
                               pid=procs[-1].pid, **_devices(placed))
        slot.proc, slot.peers = procs[0], procs[1:]

    def _start(self, argv: list[str], log_path: str, placed: dict[str, str]) -> subprocess.Popen:
        with open(log_path, "ab") as log:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env={**self.env, **placed}, start_new_session=False)

    def delivered(self, worker_id: str) -> None:
        """A submission of ``worker_id`` was accepted (called from the service's threads)."""
        with self._lock:
            for slot in self.slots:
                if not slot.delivered and (worker_id == slot.worker_id or worker_id.startswith(slot.worker_id + "~")):
                    slot.delivered = True
                    slot.failures = 0
                    self.journal.write("first_accept", slot=slot.name, role=slot.role, worker_id=worker_id)

    def pids(self) -> dict[str, int]:
        """Worker id → pid of the live children (a gang's rank r > 0: ``ID.rankR``)."""
        pids = {}
        for s in self.slots:
            if s.proc is not None and s.proc.poll() is None:
                pids[s.worker_id] = s.proc.pid
            for rank, peer in enumerate(s.peers, 1):
                if peer.poll() is None:
                    pids[f"{s.worker_id}.rank{rank}"] = peer.pid
        return pids

    @staticmethod
    def _exit_code(slot: _Slot) -> int | None:
        """The slot's exit status once it has ended, else None: a gang has ended when every rank
        exited 0, or as soon as one rank failed (the others are killed: one failure domain)."""
        assert slot.proc is not None
        procs = [slot.proc, *slot.peers]
        codes = [p.poll() for p in procs]
        failed = [c for c in codes if c not in (None, 0)]
        if not failed:
            return None if None in codes else 0
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return failed[0]

    @staticmethod
    def _ended(slot: _Slot) -> None:
        """The slot's children have been reaped: forget them (and a gang's socket directory)."""
        slot.proc, slot.peers = None, []
        if slot.coordinator_dir:
            shutil.rmtree(slot.coordinator_dir, ignore_errors=True)
            slot.coordinator_dir = ""

    def poll(self) -> None:
        """Reap dead children, record their loss, restart them (see module docstring)."""
        now = time.monotonic()
        for slot in self.slots:
            proc = slot.proc
            if proc is not None:
                code = self._exit_code(slot)
                if code is None:
                    continue
                how = describe_exit(code)
                self._ended(slot)
                if code == 0:
                    # A worker exits 0 only once the controller told it the run has finished: it
                    # is neither recorded lost nor started again.
                    slot.finished = True
                    self.journal.write("exit", slot=slot.name, role=slot.role, worker_id=slot.worker_id,
                                       pid=proc.pid, how=how)
                    continue
                ids = [wid for wid in self.joined_ids()
                       if wid == slot.worker_id or wid.startswith(slot.worker_id + "~")]
                self.lose(ids, f"process {how}")
                self.journal.write("exit", slot=slot.name, role=slot.role, worker_id=slot.worker_id, pid=proc.pid,
                                   how=how)
                with self._lock:
                    if not slot.delivered:
                        slot.failures += 1
                    failures = slot.failures
                if failures >= self.max_failures:
                    self.failure = (f"the {slot.role} worker {slot.name} died {failures} times in a row without "
                                    f"delivering work (last: {how}; its output: {slot.log_path}: "
                                    f"{_last_line(slot.log_path)})")
                    return
                slot.restart_at = now + (0.0 if failures == 0 else min(BACKOFF_FIRST_S * 2 ** (failures - 1),
                                                                       BACKOFF_MAX_S))
            if slot.proc is None and not slot.finished and now >= slot.restart_at:
                self._spawn(slot)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Wait up to ``grace_s`` for the children to exit (they do when the run finishes), then
        terminate the rest."""
        deadline = time.monotonic() + grace_s
        live = [p for s in self.slots if s.proc is not None for p in (s.proc, *s.peers)]
        for proc in live:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in live:
            if proc.poll() is None:
                proc.terminate()
        for proc in live:
            try:
                proc.wait(2.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for slot in self.slots:
            if slot.proc is not None:
                self.journal.write("exit", slot=slot.name, role=slot.role, worker_id=slot.worker_id,
                                   pid=slot.proc.pid, how=describe_exit(slot.proc.returncode))
                self._ended(slot)


def _devices(placed: dict[str, str]) -> dict[str, str]:
    """The journal's note of the devices a child was shown (none when it inherits them)."""
    from runtime.placement import DEVICES_ENV

    return {"devices": placed[DEVICES_ENV]} if DEVICES_ENV in placed else {}


def _last_line(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 4096))
            lines = [line for line in f.read().decode("utf-8", "replace").splitlines() if line.strip()]
    except OSError:
        return "(no output)"
    return lines[-1].strip()[:300] if lines else "(no output)"
