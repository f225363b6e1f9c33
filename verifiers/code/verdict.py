"""From what a run did to a verdict: a pure function, checked in the sandbox spec's order.

OLE (output cap) -> TLE (wall kill, SIGXCPU) -> MLE (the run's cgroup killed a process of it
for memory, whatever the exit status) -> TLE (a SIGKILL neither the harness nor the memory cgroup
sent: the only one left is the kernel's at the CPU hard limit, one second after SIGXCPU) -> MLE
(a MemoryError / bad_alloc report, or an abort at the address-space limit) -> RE (non-zero exit
or a signal) -> the checker, which says AC or WA. The program's own exit code or printed messages
never make a run pass: at best they make it fail.
"""

from __future__ import annotations

import signal

from verifiers.code.limits import Limits
from verifiers.code.sandbox import RunResult
from verifiers.outcome import Verdict

_MEMORY_MARKERS = (b"MemoryError", b"std::bad_alloc", b"Cannot allocate memory", b"out of memory")


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def classify(run: RunResult, limits: Limits) -> tuple[Verdict, str] | None:
    """The verdict a run earns before any checker looks at its output; None if it ran cleanly."""
    if run.output_exceeded:
        return Verdict.OLE, f"output exceeded {limits.output_bytes} bytes"
    if run.timed_out:
        return Verdict.TLE, f"wall time limit of {limits.wall_s:g} s exceeded"
    cpu = Verdict.TLE, f"CPU time limit of {limits.cpu_rlimit} s exceeded"
    if run.signal == signal.SIGXCPU:
        return cpu
    if run.memory_exceeded:
        return Verdict.MLE, f"memory limit of {limits.memory_bytes} bytes for the whole run exceeded (out-of-memory kill)"
    if run.signal == signal.SIGKILL and not run.killed:
        return cpu
    failed = run.signal is not None or run.exit_code != 0
    tail = run.stderr[-4096:]
    if failed and any(marker in tail for marker in _MEMORY_MARKERS):
        return Verdict.MLE, f"memory limit of {limits.memory_bytes} bytes exceeded"
    if run.signal is not None:
        if run.signal == signal.SIGXFSZ:
            return Verdict.RE, f"file size limit of {limits.file_bytes} bytes exceeded (SIGXFSZ)"
        return Verdict.RE, f"killed by {_signal_name(run.signal)}"
    if run.exit_code != 0:
        excerpt = stderr_excerpt(run)
        return Verdict.RE, f"exit status {run.exit_code}" + (f": {excerpt}" if excerpt else "")
    return None


def stderr_excerpt(run: RunResult, limit: int = 300) -> str:
    """The last line of stderr (e.g. a Python exception), shortened: for details only."""
    lines = [line for line in run.stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    if not lines:
        return ""
    last = lines[-1].strip()
    return last if len(last) <= limit else last[: limit - 3] + "..."


def first_error(run: RunResult, limit: int = 300) -> str:
    """The first stderr line that reports an error (a compiler's diagnostic), shortened."""
    for line in run.stderr.decode("utf-8", "replace").splitlines():
        if "error" in line.lower():
            line = line.strip()
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return stderr_excerpt(run, limit)
