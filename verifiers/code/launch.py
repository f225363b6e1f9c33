"""What one run execs: its slot's resources made ready, the command line, the fds it inherits.

``prepare`` sets the slot's cgroup limits for the run, mounts the run's own tmpfs, and builds
the command of the isolation level: for ``namespaces`` bwrap with the staged files, the seccomp
program and bwrap's info pipe as inherited fds; for ``rlimits`` the chain run in the tmpfs (or a
temp dir) directly. Either way a slot with a cgroup starts by joining it. ``LiveRun`` spawns it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from collections.abc import Collection, Mapping

from verifiers.code import cgroups, isolation, mounts, seccomp
from verifiers.code.isolation import Isolation, RunFs, StagedFile
from verifiers.code.limits import Limits

# File descriptors of a namespaces run: bwrap's info pipe, the seccomp program, staged files.
_INFO_FD, _SECCOMP_FD, _FIRST_FILE_FD = 3, 4, 5
_CHILD_PID = re.compile(rb'"child-pid"\s*:\s*(\d+)')


@dataclasses.dataclass(frozen=True)
class Slot:
    """What a run gets from its sandbox: a uid, and where available a cgroup and a tmpfs."""

    uid: int
    uids: Collection[int]  # every uid of the sandbox (orphans of any of them are reaped)
    cgroup: cgroups.SlotCgroup | None = None
    fs: mounts.SlotFs | None = None


@dataclasses.dataclass
class Launch:
    """A prepared run: what to exec, and what the caller closes or removes afterwards.

    ``child_fds``: (our fd, the fd number the child gets). ``owned``: our fds to close once the
    child has its copies. ``info``: the read end of bwrap's info pipe (see ``init_pid``).
    ``run_dir``: a temp dir to remove after the run (rlimits level without a tmpfs).
    """

    cmd: list[str]
    env: Mapping[str, str]
    child_fds: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    owned: list[int] = dataclasses.field(default_factory=list)
    info: int | None = None
    run_dir: str | None = None

    def close_owned(self) -> None:
        for fd in self.owned:
            os.close(fd)
        self.owned = []


def prepare(level: Isolation, slot: Slot, argv, files: Mapping[str, bytes], limits: Limits,
            executable: Collection[str]) -> Launch:
    """Ready the slot for a run of ``argv`` and say how to start it (undo with ``release``)."""
    if slot.cgroup is not None:
        slot.cgroup.prepare(limits.memory_bytes, limits.processes)
    if slot.fs is not None:
        slot.fs.mount(limits.disk_bytes, limits.inodes,
                      owner=None if level is Isolation.NAMESPACES else slot.uid)
    try:
        if level is Isolation.NAMESPACES:
            launch = _namespaces(slot, argv, files, limits, executable)
        else:
            launch = _rlimits(slot, argv, files, limits, executable)
    except BaseException:
        if slot.fs is not None:
            slot.fs.detach()
        raise
    if slot.cgroup is not None:
        launch.cmd = cgroups.join_argv(slot.cgroup.join_files, launch.cmd)
    return launch


def _namespaces(slot: Slot, argv, files, limits: Limits, executable) -> Launch:
    launch = Launch(cmd=[], env={})
    try:
        launch.info, info_w = os.pipe()
        launch.owned.append(info_w)
        launch.child_fds.append((info_w, _INFO_FD))
        seccomp_fd = seccomp.program_fd()
        launch.owned.append(seccomp_fd)
        launch.child_fds.append((seccomp_fd, _SECCOMP_FD))
        staged = []
        for i, (name, data) in enumerate(sorted(files.items())):
            fd = os.memfd_create(f"rlx-{name}")
            launch.owned.append(fd)
            launch.child_fds.append((fd, _FIRST_FILE_FD + i))
            os.write(fd, data)
            os.lseek(fd, 0, os.SEEK_SET)
            staged.append(StagedFile(name, _FIRST_FILE_FD + i, 0o555 if name in executable else 0o444))
    except BaseException:
        launch.close_owned()
        if launch.info is not None:
            os.close(launch.info)
        raise
    fs = RunFs(slot.fs.work, slot.fs.tmp) if slot.fs is not None else None
    launch.cmd = isolation.namespaces_argv(
        argv, limits=limits, uid=slot.uid, files=staged, fs=fs, seccomp_fd=_SECCOMP_FD, info_fd=_INFO_FD
    )
    return launch


def _rlimits(slot: Slot, argv, files, limits: Limits, executable) -> Launch:
    """The rlimits level runs in the slot's tmpfs, else in a temp dir of its own."""
    run_dir = None
    if slot.fs is not None:
        work, tmp = slot.fs.work, slot.fs.tmp
    else:
        run_dir = tempfile.mkdtemp(prefix="rlx-run-")
        work, tmp = run_dir, os.path.join(run_dir, "tmp")
        os.mkdir(tmp)
        for path in (work, tmp):
            os.chown(path, slot.uid, slot.uid)
            os.chmod(path, 0o700)
    for name, data in files.items():
        path = os.path.join(work, name)
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, 0o555 if name in executable else 0o444)
    cmd = ["/usr/bin/env", f"--chdir={work}", "--"] + isolation.rlimits_argv(argv, limits=limits, uid=slot.uid)
    return Launch(cmd=cmd, env=isolation.environment(work, tmp), run_dir=run_dir)


def init_pid(info: int) -> int | None:
    """The host pid of bwrap's pid-namespace init, from its info pipe (closed here)."""
    os.set_blocking(info, False)
    try:
        data = os.read(info, 1 << 12)
    except BlockingIOError:
        data = b""
    finally:
        os.close(info)
    found = _CHILD_PID.search(data)
    return int(found.group(1)) if found is not None else None
