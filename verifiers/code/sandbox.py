"""Run untrusted programs: the I/O shell of the code verifier.

A ``Sandbox`` owns a fixed set of slots, one non-root uid each, so concurrent runs never share a
uid (``RLIMIT_NPROC`` and kill-by-uid are per uid). Each run (``live.LiveRun``) takes a slot and
gives it back only once every process of its uid is gone and reaped; a uid that cannot be swept
clean stays out of service. The isolation level is probed once and reported with every outcome.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import queue
import subprocess
from typing import Iterator, Mapping, Sequence

from verifiers.code import isolation, processes
from verifiers.code.isolation import Isolation
from verifiers.code.limits import Limits
from verifiers.code.live import LiveRun, RunResult
from verifiers.errors import ConfigError, SandboxUnavailable

__all__ = ["LiveRun", "RunResult", "Sandbox", "resolve"]
_UID_LOCKS = "/run/rlx-sandbox-uids"
_UID_SEARCH = 10_000


def _claim_uids(slots: int, uid_base: int) -> tuple[list[int], list[int]]:
    """``slots`` uids from ``uid_base`` up that no other live sandbox holds, and their lock fds.

    Each uid is held by an exclusive ``flock`` on a file under ``/run`` for as long as this
    process lives, so two verifier processes on one host never share a uid (kill-by-uid and
    ``RLIMIT_NPROC`` would otherwise reach across them).
    """
    os.makedirs(_UID_LOCKS, mode=0o700, exist_ok=True)
    uids: list[int] = []
    fds: list[int] = []
    for uid in range(uid_base, uid_base + _UID_SEARCH):
        fd = os.open(f"{_UID_LOCKS}/{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        uids.append(uid)
        fds.append(fd)
        if len(uids) == slots:
            return uids, fds
    for fd in fds:
        os.close(fd)
    raise SandboxUnavailable(f"no {slots} free sandbox uids from {uid_base} up")


@functools.cache
def _namespaces_work() -> bool:
    if not (os.path.exists(isolation.BWRAP) and os.geteuid() == 0):
        return False
    try:
        done = subprocess.run(
            isolation.probe_argv(), stdin=subprocess.DEVNULL, capture_output=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def resolve(level: Isolation | str) -> Isolation:
    """The isolation level to use: the one asked for, or the strongest that works here."""
    try:
        level = Isolation(level)
    except ValueError:
        names = ", ".join(i.value for i in Isolation)
        raise ConfigError(f"isolation {level!r} is not one of: {names}") from None
    for tool in (isolation.PRLIMIT, isolation.SETPRIV, isolation.KILL):
        if not os.path.exists(tool):
            raise SandboxUnavailable(f"{tool} is missing; install util-linux and procps")
    if os.geteuid() != 0:
        raise SandboxUnavailable("the sandbox must start as root to drop each run to its own uid")
    if level is Isolation.AUTO:
        return Isolation.NAMESPACES if _namespaces_work() else Isolation.RLIMITS
    if level is Isolation.NAMESPACES and not _namespaces_work():
        raise SandboxUnavailable(
            "isolation 'namespaces' needs a working bubblewrap (apt-get install bubblewrap) "
            "and permission to create namespaces; use 'rlimits' or 'auto'"
        )
    return level


class Sandbox:
    """Runs programs isolated from the host and from each other.

    Args:
      isolation: ``"auto"`` (strongest available), ``"namespaces"`` or ``"rlimits"``.
      slots: how many runs may be live at once (each has its own uid).
      uid_base: the lowest uid to use; slots take the first free ones from there up (no other
        user of the host may own uids in that range).
    """

    def __init__(self, isolation: Isolation | str = Isolation.AUTO, *, slots: int = 4, uid_base: int = 61_000):
        if not isinstance(slots, int) or slots < 1:
            raise ConfigError(f"sandbox slots {slots!r} must be an integer >= 1")
        if not isinstance(uid_base, int) or uid_base < 1000:
            raise ConfigError(f"sandbox uid_base {uid_base!r} must be an integer >= 1000")
        self.level = resolve(isolation)
        self.uids, self._locks = _claim_uids(slots, uid_base)
        self._free: queue.Queue[int] = queue.Queue()
        for uid in self.uids:
            self._free.put(uid)
        processes.become_subreaper()

    @property
    def slots(self) -> int:
        return len(self.uids)

    def close(self) -> None:
        """Give the slots' uids back to other sandboxes (waits for live runs to end)."""
        for _ in self.uids:
            self._free.get()
        for fd in self._locks:
            os.close(fd)
        self._locks = []

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(
        self,
        argv: Sequence[str],
        *,
        files: Mapping[str, bytes] = {},
        stdin: bytes = b"",
        limits: Limits = Limits(),
        executable: Sequence[str] = (),
    ) -> RunResult:
        """Run ``argv`` in the work dir holding ``files``, feed ``stdin``, collect the output.

        ``executable`` names the files that get mode 0555 instead of 0444.
        """
        with self.start(argv, files=files, limits=limits, executable=executable) as live:
            live.send(stdin)
            live.close_stdin()
            return live.finish()

    @contextlib.contextmanager
    def start(
        self,
        argv: Sequence[str],
        *,
        files: Mapping[str, bytes] = {},
        limits: Limits = Limits(),
        executable: Sequence[str] = (),
    ) -> Iterator[LiveRun]:
        """A live run to talk to line by line; torn down (nothing left) when the block ends."""
        for name in files:
            if not name or "/" in name or name.startswith("."):
                raise ConfigError(f"sandbox file name {name!r} must be a plain name like main.py")
        uid = self._free.get()
        live = None
        try:
            live = LiveRun(self.level, uid, self.uids, argv, files, limits, frozenset(executable))
            yield live
        finally:
            clean = live.teardown() if live is not None else processes.sweep(uid, self.uids)
            if clean:
                self._free.put(uid)
            # else the uid stays out of service: something of it could not be killed
