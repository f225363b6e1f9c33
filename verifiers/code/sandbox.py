"""Run untrusted programs: the I/O shell of the code verifier.

A ``Sandbox`` owns a fixed set of slots, one non-root uid each, so concurrent runs never share a
uid (``RLIMIT_NPROC`` and kill-by-uid are per uid). Each run (``live.LiveRun``) takes a slot and
gives it back only once every process of its uid is gone and reaped; a uid that cannot be swept
clean stays out of service. Where the machine allows it a slot also has its own cgroup (memory
and process limits of a whole run) and its own tmpfs mount point (size and inode caps).

The isolation level is probed once and reported with every outcome. ``auto`` falling back to the
weak ``rlimits`` level is never silent: it is refused unless ``allow_weak=True`` (then a
``RuntimeWarning`` and a log line say why), and ``fallback`` keeps the reason for the record.
``describe()`` is one line naming the level and how each limit is enforced.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import queue
import subprocess
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence

from verifiers.code import cgroups, isolation, mounts, processes, seccomp
from verifiers.code.isolation import Isolation
from verifiers.code.limits import Limits
from verifiers.code.live import LiveRun, RunResult, Slot
from verifiers.errors import ConfigError, SandboxUnavailable

__all__ = ["LiveRun", "RunResult", "Sandbox", "WeakIsolationRefused", "probe_namespaces", "resolve"]
log = logging.getLogger(__name__)
# Set to "1" to make the namespaces probe fail for real (it runs under a seccomp filter that
# denies creating namespaces): how tests, including other packages' tests, reach the fallback.
NO_NAMESPACES_ENV = "RLX_SANDBOX_NO_NAMESPACES"
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


class WeakIsolationRefused(SandboxUnavailable):
    """``auto`` found only the weak ``rlimits`` level, which was neither named nor allowed."""


HELD_SLOT_WAIT_S = 60.0


def probe_namespaces() -> str | None:
    """None where the namespaces level runs here, else why not (one line, for the record)."""
    return _probe(os.environ.get(NO_NAMESPACES_ENV) == "1")


@functools.cache
def _probe(deny_namespaces: bool) -> str | None:
    if not os.path.exists(isolation.BWRAP):
        return f"{isolation.BWRAP} is missing (apt-get install bubblewrap)"
    if os.geteuid() != 0:
        return "the namespaces level must start as root"
    try:
        fd = seccomp.program_fd()
    except SandboxUnavailable as e:
        return str(e)
    try:
        done = subprocess.run(
            isolation.probe_argv(seccomp_fd=fd), pass_fds=(fd,), stdin=subprocess.DEVNULL,
            capture_output=True, timeout=30,
            preexec_fn=seccomp.deny_namespaces_here if deny_namespaces else None,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"bubblewrap did not run: {e}"
    finally:
        os.close(fd)
    if done.returncode == 0:
        return None
    lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else f"bubblewrap exited with status {done.returncode}"


def resolve(level: Isolation | str, *, allow_weak: bool = False) -> tuple[Isolation, str | None]:
    """The isolation level to use, and why it is a fallback (None when it is not one).

    ``auto`` is the strongest level that works here; if that is only ``rlimits``, it raises
    ``WeakIsolationRefused`` unless ``allow_weak``, and then warns. Naming ``rlimits`` is a
    choice, not a fallback.
    """
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
    if level is Isolation.RLIMITS:
        return level, None
    why = probe_namespaces()
    if why is None:
        return Isolation.NAMESPACES, None
    if level is Isolation.NAMESPACES:
        raise SandboxUnavailable(
            f"isolation 'namespaces' does not work here ({why}): it needs bubblewrap "
            "(apt-get install bubblewrap) and permission to create namespaces; use 'rlimits' or 'auto'"
        )
    if not allow_weak:
        raise WeakIsolationRefused(
            f"isolation 'auto' found only the weak 'rlimits' level here (namespaces: {why}), "
            "under which programs see the host's files, processes and network; name isolation "
            "'rlimits' (or pass allow_weak=True) to accept it"
        )
    message = f"sandbox isolation 'auto' fell back to the weak 'rlimits' level: {why}"
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    log.warning("%s", message)
    return Isolation.RLIMITS, why


def _slot_cgroups(uids: Sequence[int]) -> tuple[dict[int, cgroups.SlotCgroup], dict[str, str]]:
    """One cgroup per slot uid where a hierarchy is writable, and controller -> version found."""
    try:
        found = cgroups.detect()
        made = {uid: cgroups.SlotCgroup(found, f"rlx-slot-{uid}") for uid in uids}
    except OSError as e:
        log.warning("sandbox cgroups unavailable, limits stay per process: %s", e)
        return {}, {}
    return made, cgroups.describe(found)


def _slot_fs(uids: Sequence[int]) -> dict[int, mounts.SlotFs]:
    """One tmpfs mount point per slot uid where this process may mount (else none)."""
    try:
        return {uid: mounts.SlotFs(uid) for uid in uids}
    except OSError as e:
        log.warning("sandbox tmpfs mounts unavailable, disk inodes stay uncapped: %s", e)
        return {}


class Sandbox:
    """Runs programs isolated from the host and from each other.

    Args:
      isolation: ``"auto"`` (strongest available), ``"namespaces"`` or ``"rlimits"``.
      slots: how many runs may be live at once (each has its own uid).
      uid_base: the lowest uid to use; slots take the first free ones from there up (no other
        user of the host may own uids in that range).
      allow_weak: let ``"auto"`` fall back to ``"rlimits"`` (with a warning) instead of raising
        ``WeakIsolationRefused``.

    Attributes:
      level: the isolation level in force.
      fallback: why ``auto`` had to fall back to the weak level; None when it did not.
    """

    def __init__(
        self,
        isolation: Isolation | str = Isolation.AUTO,
        *,
        slots: int = 4,
        uid_base: int = 61_000,
        allow_weak: bool = False,
    ):
        if not isinstance(slots, int) or slots < 1:
            raise ConfigError(f"sandbox slots {slots!r} must be an integer >= 1")
        if not isinstance(uid_base, int) or uid_base < 1000:
            raise ConfigError(f"sandbox uid_base {uid_base!r} must be an integer >= 1000")
        self.level, self.fallback = resolve(isolation, allow_weak=allow_weak)
        self.uids, self._locks = _claim_uids(slots, uid_base)
        self._cgroups, self._controllers = _slot_cgroups(self.uids)
        self._fs = _slot_fs(self.uids)
        self._slots = {
            uid: Slot(uid, frozenset(self.uids), self._cgroups.get(uid), self._fs.get(uid))
            for uid in self.uids
        }
        self._free: queue.Queue[int] = queue.Queue()
        for uid in self.uids:
            self._free.put(uid)
        self._held: set[int] = set()  # uids whose teardown left a process behind
        self._held_lock = threading.Lock()
        self._stuck = False  # every slot stayed held for HELD_SLOT_WAIT_S: later callers fail at once
        processes.become_subreaper()
        log.info("%s", self.describe())

    @property
    def slots(self) -> int:
        return len(self.uids)

    def enforced_limits(self) -> dict[str, str]:
        """How each limit and each kind of isolation is enforced here (name -> one phrase)."""
        ns = self.level is Isolation.NAMESPACES
        memory, pids = self._controllers.get("memory"), self._controllers.get("pids")
        if self._fs:
            disk = "per run (own tmpfs capped in bytes and inodes)"
        elif ns:
            disk = "per directory (bwrap tmpfs capped in bytes, inodes uncapped)"
        else:
            disk = "uncapped (host temp dir; RLIMIT_FSIZE per file)"
        return {
            "wall": "per run (harness timer)",
            "output": "per run (harness)",
            "cpu": "per process (RLIMIT_CPU)",
            "memory": f"per run ({memory} memory) and per process (RLIMIT_AS)" if memory
            else "per process only (RLIMIT_AS; no writable memory cgroup)",
            "processes": f"per run ({pids} pids, RLIMIT_NPROC of the run's uid)" if pids
            else "per run (RLIMIT_NPROC of the run's uid)",
            "disk": disk,
            "syscalls": "seccomp deny-list (keyring, namespaces, io_uring, bpf, ptrace, mounts)"
            if ns else "unfiltered (no seccomp)",
            "files": "private view" if ns else "host file system visible",
            "network": "own network namespace" if ns else "host network reachable",
        }

    def describe(self) -> str:
        """One line: the isolation level (and why it is a fallback) and how limits are enforced."""
        head = f"sandbox isolation {self.level.value}"
        if self.fallback is not None:
            head += f" (fallback: {self.fallback})"
        return head + "; " + ", ".join(f"{name} {how}" for name, how in self.enforced_limits().items())

    def close(self) -> None:
        """Give the slots' uids back to other sandboxes (waits for live runs to end)."""
        returned = 0
        while True:
            with self._held_lock:
                if returned + len(self._held) >= len(self.uids):
                    break
            try:
                self._free.get(timeout=0.5)
                returned += 1
            except queue.Empty:
                continue
        for cgroup in self._cgroups.values():
            cgroup.remove()
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
        uid = self._take_slot()
        live = None
        try:
            live = LiveRun(self.level, self._slots[uid], argv, files, limits, frozenset(executable))
            yield live
        finally:
            clean = False
            try:
                clean = live.teardown() if live is not None else processes.sweep(uid, self.uids)
            finally:  # a teardown that raised must not lose the slot: it is held, and swept again later
                if clean:
                    self._free.put(uid)
                else:  # out of service until a later sweep finds nothing of it left
                    with self._held_lock:
                        self._held.add(uid)

    def _take_slot(self) -> int:
        """A free slot's uid. While none is free, slots held out of service are swept again
        (what a busy host could not kill at once is usually gone a moment later); if every slot
        stays held for ``HELD_SLOT_WAIT_S``, the sandbox is unavailable rather than waiting forever
        (and, while that lasts, every later caller is told so at once instead of waiting again)."""
        waited = 0.0
        while True:
            try:
                uid = self._free.get(timeout=0.5)
                self._stuck = False
                return uid
            except queue.Empty:
                waited += 0.5
            with self._held_lock:
                held = sorted(self._held)
            for uid in held:
                if processes.sweep(uid, self.uids):
                    with self._held_lock:
                        self._held.discard(uid)
                    self._free.put(uid)
            with self._held_lock:
                stuck = len(self._held) == len(self.uids)
            if not stuck:
                self._stuck = False
            if stuck and (waited >= HELD_SLOT_WAIT_S or self._stuck):
                self._stuck = True
                raise SandboxUnavailable(f"every sandbox slot ({', '.join(map(str, sorted(self._held)))}) still "
                                         f"holds processes that could not be killed after {HELD_SLOT_WAIT_S:.0f} s")
