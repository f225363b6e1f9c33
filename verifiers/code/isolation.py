"""Isolation levels of the code sandbox, and the command lines that build them (pure).

``namespaces`` (preferred; Debian ``bubblewrap``): new pid, network, ipc and uts namespaces, a
private file-system view (read-only ``/usr``, fresh ``/proc`` and ``/dev``, the run's own tmpfs as
work dir and ``/tmp``, nothing else of the host), every capability dropped, a non-root uid, a
seccomp filter (``seccomp.py``), rlimits. Killing bwrap tears down the pid namespace, so nothing
the program started outlives the run.

``rlimits`` (fallback where namespaces are not allowed): a non-root uid per slot, a new session,
rlimits, and a harness that kills every process of that uid. The host file system stays visible
(world-readable files can be read), ``/tmp`` is the run's own directory only by convention
(``TMPDIR``), the network is not blocked and no seccomp filter is loaded. Outcomes say which
level ran.

The chain run inside either level is ``prlimit`` (rlimits, set while still root so that
``RLIMIT_NPROC`` holds for the new uid) then ``setpriv`` (drop to the slot's uid and gid, clear
groups, empty capability sets, ``no_new_privs``) then the program. Both are util-linux binaries.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence

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


@dataclasses.dataclass(frozen=True)
class RunFs:
    """Host directories of the run's own tmpfs, bound as the work dir and as ``/tmp``."""

    work: str
    tmp: str


def namespaces_argv(
    argv: Sequence[str],
    *,
    limits: Limits,
    uid: int,
    files: Sequence[StagedFile],
    fs: RunFs | None = None,
    seccomp_fd: int | None = None,
    info_fd: int | None = None,
    ro_binds: Sequence[str] = (),
) -> list[str]:
    """The bwrap command line that runs ``argv`` in the namespaces level.

    ``fs``: the run's own tmpfs (capped in bytes and inodes); None: bwrap's tmpfs, capped in
    bytes only. ``seccomp_fd``: a BPF program bwrap loads before the command. ``info_fd``: where
    bwrap writes the host pid of its pid-namespace init (``child-pid``), which must be reaped.
    """
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
    if info_fd is not None:
        cmd += ["--info-fd", str(info_fd)]
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
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
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    if fs is not None:
        cmd += ["--bind", fs.tmp, "/tmp", "--bind", fs.work, WORK_DIR]
    else:
        cmd += [
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


def probe_argv(seccomp_fd: int | None = None) -> list[str]:
    """A trivial namespaces-level run; it succeeds exactly where the level can run."""
    return namespaces_argv(["/usr/bin/true"], limits=Limits(), uid=65534, files=(), seccomp_fd=seccomp_fd)
