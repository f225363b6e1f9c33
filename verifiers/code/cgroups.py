"""Per-run memory and process limits: one pooled cgroup per sandbox slot.

rlimits bind each process (``RLIMIT_AS``) or each uid, so three processes could hold three times
the memory limit. A cgroup binds everything a run starts, kernel memory included (tmpfs inodes,
page tables), and counts the out-of-memory kills it had to make, which turns into a definite MLE.

Where the machine allows it: cgroup v2 where this process's own cgroup delegates the ``memory``
and ``pids`` controllers, else cgroup v1 hierarchies of those controllers that are writable (each
on its own). Detected once; ``describe`` says what was found. Each slot's cgroup is
made once under this process's own cgroup (so limits above it still hold), its limits written
only when they change, and a run joins it by a shell that moves itself in before it execs the
rest of the command line (``join_argv``). In v1 the shell writes ``0`` (itself) to ``tasks``:
moving only the calling thread skips the global lock that ``cgroup.procs`` takes, whose wait
for an RCU grace period cost several milliseconds per run. The counters are cumulative, so a
run's OOM kills are the difference between two reads.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence

SHELL = "/bin/sh"
_JOIN = 'while [ "$1" != -- ]; do echo 0 >"$1" || exit 125; shift; done; shift; exec "$@"'
# bwrap's outer process and its pid-namespace init are in the run's cgroup besides the program.
SANDBOX_PROCESSES = 2


@dataclasses.dataclass(frozen=True)
class Hierarchy:
    """Where one controller (or, for v2, both) lives: the directory of this process's cgroup."""

    version: int
    controllers: tuple[str, ...]
    own_dir: str


def _mounts() -> list[tuple[str, str, str, str]]:
    """(root, mount point, fs type, super options) of every cgroup file system mounted here."""
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if rfields and rfields[0] in ("cgroup", "cgroup2"):
                found.append((fields[3], fields[4], rfields[0], rfields[2] if len(rfields) > 2 else ""))
    return found


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and under key ``""`` its v2 path."""
    paths: dict[str, str] = {}
    with open("/proc/self/cgroup", encoding="utf-8") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                paths[name] = path
    return paths


def _under(mount_point: str, root: str, path: str) -> str:
    rel = path[len(root):] if root != "/" and path.startswith(root) else path
    return os.path.join(mount_point, rel.lstrip("/"))


def _v2() -> Hierarchy | None:
    own = _own_paths().get("")
    for root, point, fstype, _ in _mounts():
        if fstype != "cgroup2" or own is None:
            continue
        own_dir = _under(point, root, own)
        try:
            with open(os.path.join(own_dir, "cgroup.subtree_control"), encoding="ascii") as f:
                enabled = f.read().split()
            if not {"memory", "pids"} <= set(enabled):
                with open(os.path.join(own_dir, "cgroup.subtree_control"), "w", encoding="ascii") as f:
                    f.write("+memory +pids")
        except OSError:
            continue  # not delegated here (or this cgroup holds processes and is not the root)
        return Hierarchy(2, ("memory", "pids"), own_dir)
    return None


def _v1(controller: str) -> Hierarchy | None:
    own = _own_paths().get(controller)
    for root, point, fstype, options in _mounts():
        if fstype == "cgroup" and controller in options.split(",") and own is not None:
            own_dir = _under(point, root, own)
            if os.access(own_dir, os.W_OK):
                return Hierarchy(1, (controller,), own_dir)
    return None


@functools.cache
def detect() -> tuple[Hierarchy, ...]:
    """The hierarchies that hold memory and pids limits here (v2 preferred), maybe none."""
    v2 = _v2()
    if v2 is not None:
        return (v2,)
    return tuple(h for h in (_v1("memory"), _v1("pids")) if h is not None)


def describe(hierarchies: Sequence[Hierarchy]) -> dict[str, str]:
    """Controller -> "cgroup v1" / "cgroup v2", for the controllers found."""
    return {c: f"cgroup v{h.version}" for h in hierarchies for c in h.controllers}


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(value)


def _read(path: str) -> str:
    with open(path, encoding="ascii") as f:
        return f.read()


def _counter(path: str, key: str) -> int:
    """The value of ``key`` in a flat-keyed file such as ``memory.events``; 0 if absent."""
    try:
        for line in _read(path).splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


class SlotCgroup:
    """The cgroup(s) of one slot: made once, limits set when they change, counters per run."""

    def __init__(self, hierarchies: Sequence[Hierarchy], name: str):
        self.dirs: dict[int, dict[str, str]] = {}  # version -> controller -> directory
        self._oom_base = self._pids_base = 0
        for h in hierarchies:
            path = os.path.join(h.own_dir, name)
            os.makedirs(path, exist_ok=True)
            for c in h.controllers:
                self.dirs.setdefault(h.version, {})[c] = path

    def _dir(self, controller: str) -> tuple[int, str] | None:
        for version, by_controller in self.dirs.items():
            if controller in by_controller:
                return version, by_controller[controller]
        return None

    @property
    def join_files(self) -> list[str]:
        """The files a run's first process writes ``0`` to, to move itself into the cgroups."""
        name = {1: "tasks", 2: "cgroup.procs"}
        return sorted({os.path.join(d, name[v]) for v, by in self.dirs.items() for d in by.values()})

    @staticmethod
    def _write_limit(path: str, value: str) -> None:
        """Write ``value`` unless the kernel already holds it. The kernel's value, not one noted
        here, decides: a slot's directory outlives the sandbox that set it, and another sandbox of
        the same slot uid (in this process or another) may have set other limits since."""
        try:
            if _read(path).strip() == value:
                return
        except OSError:
            pass
        _write(path, value)

    def prepare(self, memory_bytes: int, processes: int) -> None:
        """Set the limits for the next run (whole run) and note the counters it starts from."""
        memory = self._dir("memory")
        if memory is not None:
            version, d = memory
            if version == 2:
                self._write_limit(os.path.join(d, "memory.max"), str(memory_bytes))
                if os.path.exists(os.path.join(d, "memory.swap.max")):
                    self._write_limit(os.path.join(d, "memory.swap.max"), "0")
            else:
                self._set_v1_memory(d, memory_bytes)
        pids = self._dir("pids")
        if pids is not None:
            self._write_limit(os.path.join(pids[1], "pids.max"), str(processes + SANDBOX_PROCESSES))
        self._oom_base, self._pids_base = self._oom_kills(), self._pids_refused()

    def _set_v1_memory(self, d: str, memory_bytes: int) -> None:
        limit = os.path.join(d, "memory.limit_in_bytes")
        memsw = os.path.join(d, "memory.memsw.limit_in_bytes")
        files = [limit] + ([memsw] if os.path.exists(memsw) else [])
        try:
            raising = int(_read(limit)) < memory_bytes
        except (OSError, ValueError):
            raising = False
        if raising:
            files.reverse()  # memory+swap first: it may never be below memory
        for path in files:
            try:
                self._write_limit(path, str(memory_bytes))
            except OSError:  # below what the cgroup still holds (page cache of earlier runs)
                _write(os.path.join(d, "memory.force_empty"), "0")
                self._write_limit(path, str(memory_bytes))

    def _oom_kills(self) -> int:
        memory = self._dir("memory")
        if memory is None:
            return 0
        version, d = memory
        if version == 2:
            return _counter(os.path.join(d, "memory.events"), "oom_kill")
        return _counter(os.path.join(d, "memory.oom_control"), "oom_kill")

    def _pids_refused(self) -> int:
        pids = self._dir("pids")
        return 0 if pids is None else _counter(os.path.join(pids[1], "pids.events"), "max")

    def usage(self) -> tuple[int, int]:
        """(out-of-memory kills, refused forks) since ``prepare``: what the last run hit."""
        return self._oom_kills() - self._oom_base, self._pids_refused() - self._pids_base

    def remove(self) -> None:
        """Remove the slot's cgroups (only once empty; a busy one is left for the next owner)."""
        for by_controller in self.dirs.values():
            for d in set(by_controller.values()):
                try:
                    os.rmdir(d)
                except OSError:
                    pass


def join_argv(join_files: Sequence[str], argv: Sequence[str]) -> list[str]:
    """``argv`` started by a shell that first moves itself into the given cgroups (same pid)."""
    if not join_files:
        return list(argv)
    return [SHELL, "-c", _JOIN, "rlx-join", *join_files, "--", *argv]
