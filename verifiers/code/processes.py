"""Process bookkeeping of the sandbox: subreaping, orphan reaping, sweeping a uid clean.

The verifier makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``) so that processes
orphaned by a killed run are re-parented to it rather than to the host's init, and reaps them:
an unreaped zombie still counts against its uid's ``RLIMIT_NPROC`` and would make the next run on
that uid fail to fork (a false RE). Only orphans that belong to the sandbox are reaped (a sandbox
uid, or a ``bwrap`` the sandbox did not start itself), so other children of this process, such as
``subprocess.Popen`` workers, keep their exit statuses.

A namespaces run leaves one orphan even when it ends by itself: bwrap's outer process exits as
soon as the program's exit code is in, before the pid-namespace init it forked has exited, so
that init is re-parented to us. ``reap_init`` waits for exactly that process (its pid comes
from bwrap's ``--info-fd``); left alone, one zombie per run piled up until the host ran out of
pids.
"""

from __future__ import annotations

import ctypes
import os
import select
import subprocess
import threading
import time
from collections.abc import Collection

from verifiers.code import isolation

_PR_SET_CHILD_SUBREAPER = 36
_SURVIVOR_SWEEPS = 200
_subreaper_lock = threading.Lock()
_subreaper = False

# Guards the window between spawning a process and recording it as ours, so that the orphan
# reaper never collects the exit status of a process the sandbox is about to wait for.
spawn_lock = threading.Lock()
_own_pids: set[int] = set()


def become_subreaper() -> bool:
    """Make this process a child subreaper (idempotent); False where the kernel refuses."""
    global _subreaper
    with _subreaper_lock:
        if not _subreaper:
            libc = ctypes.CDLL(None, use_errno=True)
            _subreaper = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        return _subreaper


def register(pid: int) -> None:
    """Record ``pid`` as a process the sandbox waits for itself (call under ``spawn_lock``)."""
    _own_pids.add(pid)


def unregister(pid: int) -> None:
    with spawn_lock:
        _own_pids.discard(pid)


def _stat(pid: int) -> tuple[str, str, int] | None:
    """(comm, state, ppid) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return None
    comm_end = raw.rfind(")")
    comm = raw[raw.find("(") + 1 : comm_end]
    fields = raw[comm_end + 2 :].split()
    return comm, fields[0], int(fields[1])


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _uid_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def processes_of(uid: int) -> list[int]:
    """Every process (zombies included) whose owner is ``uid``."""
    return [pid for pid in _pids() if _uid_of(pid) == uid]


def reap_orphans(sandbox_uids: Collection[int]) -> int:
    """Reap zombie children that the sandbox orphaned; returns how many were reaped."""
    me = os.getpid()
    reaped = 0
    with spawn_lock:
        for pid in _pids():
            if pid in _own_pids:
                continue
            stat = _stat(pid)
            if stat is None:
                continue
            comm, state, ppid = stat
            if ppid != me or state != "Z":
                continue
            if _uid_of(pid) in sandbox_uids or comm == "bwrap":
                try:
                    os.waitpid(pid, os.WNOHANG)
                    reaped += 1
                except ChildProcessError:
                    pass
    return reaped


def reap_init(pid: int, timeout_s: float = 5.0) -> bool:
    """Reap the bwrap pid-namespace init ``pid`` once it has exited; True if it was ours to reap.

    Call only after bwrap's outer process has been collected: by then the init is either our
    child (re-parented) or already reaped by bwrap. A pidfd pins the process, so a pid reused
    by something else is never waited for (it is not a ``bwrap`` child of ours).
    """
    with spawn_lock:
        if pid in _own_pids:
            return False
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False  # already reaped by bwrap
    try:
        stat = _stat(pid)
        if stat is None or stat[0] != "bwrap" or stat[2] != os.getpid():
            return False
        # It dies with bwrap (--die-with-parent). poll, not select: a busy process's pidfd may be
        # numbered past select's limit of 1024 (which raised here and lost the sandbox's slot).
        waiter = select.poll()
        waiter.register(pidfd, select.POLLIN)
        waiter.poll(timeout_s * 1000)
        try:
            return os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG) is not None
        except ChildProcessError:
            return False
    finally:
        os.close(pidfd)


def sweep(uid: int, uids: Collection[int], *, orphans_possible: bool = True) -> bool:
    """Kill and reap every process of ``uid``; True once none is left.

    ``orphans_possible=False`` skips the orphan scan while nothing of the uid is left: a bwrap
    that exited by itself has reaped its pid namespace, so nothing of the uid was re-parented
    to us (its own init is reaped by ``reap_init``).
    """
    for attempt in range(_SURVIVOR_SWEEPS):
        if orphans_possible or attempt:
            reap_orphans(uids)
        if not processes_of(uid):
            return True
        subprocess.run(isolation.kill_uid_argv(uid), stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        time.sleep(min(0.05, 0.001 * (attempt + 1)))
    return False
