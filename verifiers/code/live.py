"""One live sandboxed run: spawn, supervise, tear down (the I/O shell under ``Sandbox``).

A run is spawned with ``posix_spawn`` (no Python code runs between fork and exec, so it is safe
from any thread), supervised through one ``selectors`` loop (stdin fed without blocking, stdout
and stderr read under one output cap, a pidfd for the exit, a wall-clock deadline), then torn
down: the process tree is killed and every process of the slot's uid is gone and reaped, and
the run's tmpfs is detached. A slot's cgroup (if any) holds the whole run: its first process
joins it before anything else starts (``cgroups.join_argv``), so its memory and process limits
bind the run as a whole, and its out-of-memory kills are reported in the result.

Nothing is judged here: a ``RunResult`` says what happened; ``verdict.classify`` decides.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import selectors
import shutil
import signal
import subprocess
import time

from verifiers.code import isolation, launch, processes
from verifiers.code.isolation import Isolation
from verifiers.code.launch import Slot

__all__ = ["LiveRun", "RunResult", "Slot"]


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What one sandboxed run did; measurements included, nothing decided.

    ``exit_code`` is None when the run ended by a signal (``signal`` set) or was killed by the
    harness (``timed_out`` or ``output_exceeded``); ``killed`` says the harness sent the kill.
    ``memory_exceeded``: the run's cgroup had to kill a process of it for memory (the whole run
    went over ``memory_bytes``); ``forks_refused``: forks its cgroup refused at the process cap.
    """

    exit_code: int | None
    signal: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool
    output_exceeded: bool
    killed: bool
    wall_s: float
    memory_exceeded: bool = False
    forks_refused: int = 0


class LiveRun:
    """One running sandboxed program and its pipes (made by ``Sandbox.start``)."""

    def __init__(self, level: Isolation, slot: Slot, argv, files, limits, executable):
        self.limits = limits
        self._slot = slot
        self._uid, self._uids = slot.uid, slot.uids
        self._level = level
        self._usage = (0, 0)
        self._launch = launch.prepare(level, slot, argv, files, limits, executable)
        stdin_r = stdout_w = stderr_w = -1
        try:
            stdin_r, self._stdin = os.pipe()
            self._stdout, stdout_w = os.pipe()
            self._stderr, stderr_w = os.pipe()
            actions = [
                (os.POSIX_SPAWN_DUP2, stdin_r, 0),
                (os.POSIX_SPAWN_DUP2, stdout_w, 1),
                (os.POSIX_SPAWN_DUP2, stderr_w, 2),
            ] + [(os.POSIX_SPAWN_DUP2, ours, theirs) for ours, theirs in self._launch.child_fds]
            self._start = time.monotonic()
            self.deadline = self._start + limits.wall_s
            cmd = self._launch.cmd
            with processes.spawn_lock:
                self.pid = os.posix_spawn(cmd[0], cmd, self._launch.env, file_actions=actions, setsid=True)
                processes.register(self.pid)
        except BaseException:
            self._release()
            raise
        finally:
            self._launch.close_owned()
            for fd in (stdin_r, stdout_w, stderr_w):
                if fd >= 0:
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
            if self._slot.cgroup is not None:
                self._usage = self._slot.cgroup.usage()

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
        code: int | None = None
        sig: int | None = None
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
        else:
            code = os.WEXITSTATUS(status)
            if self._level is Isolation.NAMESPACES and 128 < code <= 128 + 64:
                sig, code = code - 128, None  # bwrap reports a child's signal as 128 + n
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
            memory_exceeded=self._usage[0] > 0,
            forks_refused=self._usage[1],
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
        if self._launch.info is not None:
            pid = launch.init_pid(self._launch.info)
            self._launch.info = None
            if pid is not None:
                processes.reap_init(pid)
        orphans_possible = self._level is Isolation.RLIMITS or not self._exited_first
        clean = processes.sweep(self._uid, self._uids, orphans_possible=orphans_possible)
        self._release()
        return clean

    def _release(self) -> None:
        """Give back what ``launch.prepare`` took: the info pipe, the tmpfs, a temp dir."""
        if self._launch.info is not None:
            os.close(self._launch.info)
            self._launch.info = None
        if self._slot.fs is not None:
            self._slot.fs.detach()
        if self._launch.run_dir is not None:
            shutil.rmtree(self._launch.run_dir, ignore_errors=True)
