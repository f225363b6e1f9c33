"""Run untrusted programs: the I/O shell of the code verifier.

A ``Sandbox`` owns a fixed set of slots, one non-root uid each, so concurrent runs never share a
uid (``RLIMIT_NPROC`` and kill-by-uid are per uid). A run is spawned with ``posix_spawn`` (no
Python code runs between fork and exec, so it is safe from any thread), supervised through one
``selectors`` loop (stdin fed without blocking, stdout and stderr read under one output cap, a
pidfd for the exit, a wall-clock deadline), then torn down: the process tree is killed, every
process of the slot's uid is gone and reaped before the slot is handed to the next run.

Nothing is judged here: a ``RunResult`` says what happened; ``verdict.classify`` decides.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import os
import queue
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from typing import Iterator, Mapping, Sequence

from verifiers.code import isolation, processes
from verifiers.code.isolation import Isolation, StagedFile
from verifiers.code.limits import Limits
from verifiers.errors import ConfigError, SandboxUnavailable

_SURVIVOR_SWEEPS = 200
_FIRST_FILE_FD = 3
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


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What one sandboxed run did; measurements included, nothing decided.

    ``exit_code`` is None when the run ended by a signal (``signal`` set) or was killed by the
    harness (``timed_out`` or ``output_exceeded``); ``killed`` says the harness sent the kill.
    """

    exit_code: int | None
    signal: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool
    output_exceeded: bool
    killed: bool
    wall_s: float


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
            clean = live.teardown() if live is not None else _sweep(uid, self.uids)
            if clean:
                self._free.put(uid)
            # else the uid stays out of service: something of it could not be killed


def _sweep(uid: int, uids: Sequence[int]) -> bool:
    """Kill and reap every process of ``uid``; True once none is left."""
    for attempt in range(_SURVIVOR_SWEEPS):
        processes.reap_orphans(uids)
        if not processes.processes_of(uid):
            return True
        subprocess.run(isolation.kill_uid_argv(uid), stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        time.sleep(min(0.05, 0.001 * (attempt + 1)))
    return False


class LiveRun:
    """One running sandboxed program and its pipes (made by ``Sandbox.start``)."""

    def __init__(self, level, uid, uids, argv, files, limits, executable):
        self.limits = limits
        self._uid, self._uids = uid, uids
        self._level = level
        self._run_dir: str | None = None
        staged: list[StagedFile] = []
        file_fds: list[int] = []
        try:
            if level is Isolation.NAMESPACES:
                for i, (name, data) in enumerate(sorted(files.items())):
                    fd = os.memfd_create(f"rlx-{name}")
                    file_fds.append(fd)
                    os.write(fd, data)
                    os.lseek(fd, 0, os.SEEK_SET)
                    mode = 0o555 if name in executable else 0o444
                    staged.append(StagedFile(name, _FIRST_FILE_FD + i, mode))
                cmd = isolation.namespaces_argv(argv, limits=limits, uid=uid, files=staged)
                env: Mapping[str, str] = {}
            else:
                self._run_dir = self._make_run_dir(files, executable)
                env = isolation.fallback_environment(self._run_dir)
                cmd = ["/usr/bin/env", f"--chdir={self._run_dir}", "--"]
                cmd += isolation.rlimits_argv(argv, limits=limits, uid=uid)
            stdin_r, self._stdin = os.pipe()
            self._stdout, stdout_w = os.pipe()
            self._stderr, stderr_w = os.pipe()
            actions = [
                (os.POSIX_SPAWN_DUP2, stdin_r, 0),
                (os.POSIX_SPAWN_DUP2, stdout_w, 1),
                (os.POSIX_SPAWN_DUP2, stderr_w, 2),
            ] + [(os.POSIX_SPAWN_DUP2, fd, _FIRST_FILE_FD + i) for i, fd in enumerate(file_fds)]
            self._start = time.monotonic()
            self.deadline = self._start + limits.wall_s
            with processes.spawn_lock:
                self.pid = os.posix_spawn(cmd[0], cmd, env, file_actions=actions, setsid=True)
                processes.register(self.pid)
        finally:
            for fd in file_fds:
                os.close(fd)
        for fd in (stdin_r, stdout_w, stderr_w):
            os.close(fd)
        self._pidfd = os.pidfd_open(self.pid)
        os.set_blocking(self._stdin, False)
        self._pending = b""
        self._stdin_open = True
        self._out = bytearray()
        self._err = bytearray()
        self._out_taken = 0
        self._open = {self._stdout: self._out, self._stderr: self._err}
        self._selector = selectors.DefaultSelector()
        for fd in self._open:
            self._selector.register(fd, selectors.EVENT_READ)
        self._selector.register(self._pidfd, selectors.EVENT_READ)
        self._exited = False
        self._status: int | None = None
        self.timed_out = False
        self.output_exceeded = False
        self._killed = False
        self._exited_first = False

    def _make_run_dir(self, files, executable) -> str:
        run_dir = tempfile.mkdtemp(prefix="rlx-run-")
        os.mkdir(os.path.join(run_dir, "tmp"))
        for name, data in files.items():
            path = os.path.join(run_dir, name)
            with open(path, "wb") as f:
                f.write(data)
            os.chmod(path, 0o555 if name in executable else 0o444)
        for path in (run_dir, os.path.join(run_dir, "tmp")):
            os.chown(path, self._uid, self._uid)
            os.chmod(path, 0o700)
        return run_dir

    # -- talking to the program ------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Queue ``data`` for the program's stdin (written as the program reads)."""
        if self._stdin_open and data:
            self._pending += data
            self._pump(lambda: not self._pending)

    def close_stdin(self) -> None:
        """Close stdin once everything queued is written (the program then reads EOF)."""
        self._pump(lambda: not self._pending)
        if self._stdin_open:
            self._close_stdin()

    def read_line(self) -> bytes | None:
        """The next line of stdout, or None if the run ended (exit, deadline, output cap)."""
        def have_line() -> bool:
            return b"\n" in self._out[self._out_taken :]

        self._pump(have_line)
        if not have_line():
            return None
        end = self._out.index(b"\n", self._out_taken) + 1
        line = bytes(self._out[self._out_taken : end])
        self._out_taken = end
        return line

    def finish(self) -> RunResult:
        """Wait for the run to end (or kill it at the deadline) and return what it did."""
        self._pump(lambda: False)
        return self.result()

    # -- supervision -----------------------------------------------------------------------

    def _close_stdin(self) -> None:
        if self._stdin_open:
            with contextlib.suppress(KeyError):
                self._selector.unregister(self._stdin)
            os.close(self._stdin)
            self._stdin_open = False
            self._pending = b""

    def _pump(self, done) -> None:
        """Move bytes until ``done()``, or the run is over (exited and drained, or killed)."""
        while not done():
            if self._killed or (self._exited and not self._open):
                return
            if self._stdin_open:
                events = selectors.EVENT_WRITE if self._pending else 0
                if events:
                    try:
                        self._selector.modify(self._stdin, events)
                    except KeyError:
                        self._selector.register(self._stdin, events)
                else:
                    with contextlib.suppress(KeyError):
                        self._selector.unregister(self._stdin)
            left = self.deadline - time.monotonic()
            if left <= 0:
                self.timed_out = True
                self._kill()
                return
            for key, _ in self._selector.select(left):
                fd = key.fd
                if fd == self._pidfd:
                    self._on_exit()
                elif fd == self._stdin:
                    self._write_stdin()
                else:
                    self._read(fd)

    def _write_stdin(self) -> None:
        try:
            written = os.write(self._stdin, self._pending[: 1 << 16])
            self._pending = self._pending[written:]
        except BlockingIOError:
            pass
        except (BrokenPipeError, OSError):  # the program closed its stdin or exited
            self._close_stdin()

    def _read(self, fd: int) -> None:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            self._selector.unregister(fd)
            os.close(fd)
            del self._open[fd]
            return
        self._open[fd].extend(chunk)
        if len(self._out) + len(self._err) > self.limits.output_bytes:
            self.output_exceeded = True
            self._kill()

    def _on_exit(self) -> None:
        """The main process ended: kill what it left behind, so the pipes reach EOF."""
        self._exited_first = not self._killed
        self._selector.unregister(self._pidfd)
        self._exited = True
        self._collect()
        self._close_stdin()
        self._kill_tree()

    def _collect(self) -> None:
        if self._status is None:
            # The rusage of a bwrap child would not include the program, so none is taken.
            _, status = os.waitpid(self.pid, 0)
            self._status = status
            processes.unregister(self.pid)

    def _kill_tree(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        if self._level is Isolation.RLIMITS:
            subprocess.run(isolation.kill_uid_argv(self._uid), stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)

    def _kill(self) -> None:
        self._killed = True
        self._kill_tree()

    def result(self) -> RunResult:
        """Stop the run if still live and describe it."""
        if not self._exited:
            if not self._killed:
                self._kill()
            self._collect()
            self._exited = True
        assert self._status is not None
        status = self._status
        code = sig = None
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
        else:
            code = os.WEXITSTATUS(status)
            if self._level is Isolation.NAMESPACES and 128 < code <= 128 + 64:
                code, sig = None, code - 128  # bwrap reports a child's signal as 128 + n
        if self.timed_out or self.output_exceeded:
            code = None
        return RunResult(
            exit_code=code,
            signal=sig,
            stdout=bytes(self._out),
            stderr=bytes(self._err),
            timed_out=self.timed_out,
            output_exceeded=self.output_exceeded,
            killed=self._killed and not self._exited_first,
            wall_s=time.monotonic() - self._start,
        )

    def teardown(self) -> bool:
        """Kill everything of the run, release its pipes and files; True if nothing is left."""
        if not self._exited:
            self.result()
        self._close_stdin()
        for fd in list(self._open):
            self._selector.unregister(fd)
            os.close(fd)
        self._open.clear()
        with contextlib.suppress(KeyError):
            self._selector.unregister(self._pidfd)
        os.close(self._pidfd)
        self._selector.close()
        clean = _sweep(self._uid, self._uids)
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
        return clean
