"""Resource limits of one sandboxed run, validated when built."""

from __future__ import annotations

import dataclasses
import math

from verifiers.errors import ConfigError

MIB = 1 << 20
INODE_BYTES = 16 << 10


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one sandboxed program may use. Every bound is enforced outside the program.

    Attributes:
      wall_s: wall-clock seconds before the harness kills the run (TLE).
      cpu_s: CPU seconds (``RLIMIT_CPU``, rounded up to whole seconds; SIGXCPU is a TLE).
      memory_bytes: memory of the whole run where the sandbox has a memory cgroup (an
        out-of-memory kill is an MLE), and address space per process (``RLIMIT_AS``; a
        MemoryError is an MLE).
      output_bytes: stdout plus stderr the harness reads before killing the run (OLE).
      processes: processes and threads of the run (``RLIMIT_NPROC`` of its uid, and the pids
        cgroup where there is one): caps fork bombs.
      file_bytes: largest file the program may write (``RLIMIT_FSIZE``; SIGXFSZ is an RE).
      open_files: file descriptors per process (``RLIMIT_NOFILE``).
      disk_bytes: size of the run's own tmpfs, which holds its work dir and ``/tmp``; its inode
        count is capped too (``inodes``).
    """

    wall_s: float = 10.0
    cpu_s: float = 5.0
    memory_bytes: int = 512 * MIB
    output_bytes: int = 4 * MIB
    processes: int = 32
    file_bytes: int = 16 * MIB
    open_files: int = 64
    disk_bytes: int = 64 * MIB

    def __post_init__(self) -> None:
        for name in ("wall_s", "cpu_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"limit {name}={value!r} must be a finite number of seconds > 0")
        minimums = {
            "memory_bytes": 16 * MIB,
            "output_bytes": 1,
            "processes": 1,
            "file_bytes": 1,
            "open_files": 8,
            "disk_bytes": MIB,
        }
        for name, low in minimums.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(f"limit {name}={value!r} must be an integer >= {low}")

    @property
    def cpu_rlimit(self) -> int:
        """``RLIMIT_CPU`` in whole seconds (the kernel's unit), never below the asked limit."""
        return max(1, math.ceil(self.cpu_s))

    @property
    def inodes(self) -> int:
        """Files and directories the run's tmpfs may hold: one per 16 KiB of ``disk_bytes``.

        Empty files take no bytes but about 1 KiB of kernel memory each, so a size cap alone
        does not bound them.
        """
        return max(1024, self.disk_bytes // INODE_BYTES)

    def scaled(self, factor: float) -> Limits:
        """The same limits with both time bounds multiplied by ``factor`` (e.g. for compiling)."""
        return dataclasses.replace(self, wall_s=self.wall_s * factor, cpu_s=self.cpu_s * factor)
