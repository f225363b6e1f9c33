"""Isolation levels of the code sandbox, and the command lines that build them (pure).

``namespaces`` (preferred; Debian ``bubblewrap``): new pid, network, ipc and uts namespaces, a
private file-system view (read-only ``/usr``, fresh ``/proc`` and ``/dev``, size-capped tmpfs work
dir and ``/tmp``, nothing else of the host), every capability dropped, a non-root uid, rlimits.
Killing bwrap tears down the pid namespace, so nothing the program started outlives the run.

``rlimits`` (fallback where namespaces are not allowed): a non-root uid per slot, a new session,
rlimits, and a harness that kills every process of that uid. The host file system stays visible
(world-readable files can be read), ``/tmp`` is the run's own directory only by convention
(``TMPDIR``), and the network is not blocked. Outcomes say which level ran.

The chain run inside either level is ``prlimit`` (rlimits, set while still root so that
``RLIMIT_NPROC`` holds for the new uid) then ``setpriv`` (drop to the slot's uid and gid, clear
groups, empty capability sets, ``no_new_privs``) then the program. Both are util-linux binaries.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Mapping, Sequence

from verifiers.code.limits import Limits

BWRAP = "/usr/bin/bwrap"
PRLIMIT = "/usr/bin/prlimit"
SETPRIV = "/usr/bin/setpriv"
KILL = "/usr/bin/kill"
WORK_DIR = "/work"  # the program's working directory inside the namespaces level


class Isolation(str, enum.Enum):
    """How strongly a run is isolated; ``AUTO`` picks the strongest that works here."""

    AUTO = "auto"
    NAMESPACES = "namespaces"
    RLIMITS = "rlimits"


@dataclasses.dataclass(frozen=True)
class StagedFile:
    """A file placed in the run's work dir: ``name`` read from file descriptor ``fd`` (child side)."""

    name: str
    fd: int
    mode: int = 0o444


def environment(work_dir: str, tmp_dir: str) -> dict[str, str]:
    """The whole environment of a sandboxed program: nothing of the host's leaks in."""
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": work_dir,
        "TMPDIR": tmp_dir,
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",  # set and dict-of-str order reproducible between runs
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def limit_prefix(limits: Limits, uid: int) -> list[str]:
    """``prlimit ... -- setpriv ... --``: rlimits, then the drop to ``uid`` with no privileges."""
    cpu = limits.cpu_rlimit
    return [
        PRLIMIT,
        f"--cpu={cpu}:{cpu + 1}",  # SIGXCPU at the soft limit, SIGKILL a second later
        f"--as={limits.memory_bytes}",
        f"--fsize={limits.file_bytes}",
        f"--nofile={limits.open_files}",
        f"--nproc={limits.processes}",
        "--core=0",
        "--",
        SETPRIV,
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]


def namespaces_argv(
    argv: Sequence[str],
    *,
    limits: Limits,
    uid: int,
    files: Sequence[StagedFile],
    ro_binds: Sequence[str] = (),
) -> list[str]:
    """The bwrap command line that runs ``argv`` in the namespaces level."""
    cmd = [
        BWRAP,
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        # CAP_SETUID/SETGID/SETPCAP survive only until setpriv drops to the slot's uid, which
        # clears every set; without them the drop itself would fail.
        "--cap-drop", "ALL",
        "--cap-add", "CAP_SETUID",
        "--cap-add", "CAP_SETGID",
        "--cap-add", "CAP_SETPCAP",
        "--clearenv",
    ]
    for key, value in environment(WORK_DIR, "/tmp").items():
        cmd += ["--setenv", key, value]
    cmd += [
        "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/lib", "/lib",
        "--symlink", "usr/lib64", "/lib64",
        "--symlink", "usr/bin", "/bin",
        "--symlink", "usr/sbin", "/sbin",
    ]
    for path in ro_binds:
        cmd += ["--ro-bind", path, path]
    cmd += [
        "--proc", "/proc",
        "--dev", "/dev",
        "--perms", "1777", "--size", str(limits.disk_bytes), "--tmpfs", "/tmp",
        "--perms", "1777", "--size", str(limits.disk_bytes), "--tmpfs", WORK_DIR,
    ]
    for f in files:
        cmd += ["--perms", f"{f.mode:04o}", "--file", str(f.fd), f"{WORK_DIR}/{f.name}"]
    cmd += ["--chdir", WORK_DIR, "--"]
    return cmd + limit_prefix(limits, uid) + list(argv)


def rlimits_argv(argv: Sequence[str], *, limits: Limits, uid: int) -> list[str]:
    """The command line that runs ``argv`` in the rlimits level (cwd and env set by the caller)."""
    return limit_prefix(limits, uid) + list(argv)


def kill_uid_argv(uid: int) -> list[str]:
    """Kill every process of ``uid`` at once: ``kill(-1, SIGKILL)`` sent as that uid."""
    return [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", KILL, "-9", "-1"]


def probe_argv() -> list[str]:
    """A trivial namespaces-level run; it succeeds exactly where the level can run."""
    return namespaces_argv(["/usr/bin/true"], limits=Limits(), uid=65534, files=())


def describe(level: Isolation) -> str:
    """One line naming what a level does and does not isolate (for details and logs)."""
    if level is Isolation.NAMESPACES:
        return "namespaces: pid/net/ipc/uts namespaces, private fs view, no caps, non-root uid, rlimits"
    if level is Isolation.RLIMITS:
        return "rlimits: non-root uid, new session, rlimits; host fs visible, network not blocked"
    return "auto"


def fallback_environment(run_dir: str) -> Mapping[str, str]:
    """The environment of a program in the rlimits level (its work dir doubles as HOME)."""
    return environment(run_dir, f"{run_dir}/tmp")
