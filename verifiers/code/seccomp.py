"""The seccomp filter of sandboxed runs: syscalls that would let runs share state or leave their
namespaces are denied with ``EPERM`` (built with libseccomp through ``pyseccomp``).

Runs of one slot share a uid, so anything the kernel keeps per uid outlives a run: the keyring
(a key stored by one attempt was read by the next). Anything that builds new namespaces or
reaches past the run's own (nested user namespaces, ``setns``, mounts) would undo the isolation,
and some interfaces are large kernel attack surface that no judged program needs (io_uring, bpf,
perf events, userfaultfd, ptrace and cross-process memory access, module and kexec loading).

The filter is compiled once to classic BPF and handed to bubblewrap (``--seccomp FD``), which
loads it right before the program's command starts; everything the command runs inherits it.
libseccomp checks the architecture in ``seccomp_data`` and kills a process that uses another
one (i386 ``int 0x80``, x32 numbers), so the deny list cannot be side-stepped that way.
"""

from __future__ import annotations

import errno
import functools
import os

from verifiers.errors import SandboxUnavailable

try:
    import pyseccomp
except (ImportError, RuntimeError) as e:  # RuntimeError: libseccomp.so.2 is not installed
    pyseccomp = None
    _MISSING = f"seccomp filters need pyseccomp and libseccomp2 ({e})"

# Each group: why its syscalls are denied. Names are libseccomp's (resolved for the native arch).
DENIED: dict[str, tuple[str, ...]] = {
    "keyring (per-uid state shared across runs)": ("add_key", "request_key", "keyctl"),
    "namespaces (nested user namespaces, joining others)": ("unshare", "setns"),
    "io_uring": ("io_uring_setup", "io_uring_enter", "io_uring_register"),
    "tracing and other processes' memory": (
        "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
        "process_madvise", "perf_event_open",
    ),
    "kernel programs and fault handlers": ("bpf", "userfaultfd"),
    "mounts": (
        "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen",
        "fsconfig", "fsmount", "fspick", "mount_setattr",
    ),
    "host administration": (
        "swapon", "swapoff", "reboot", "kexec_load", "kexec_file_load", "init_module",
        "finit_module", "delete_module", "acct", "quotactl", "syslog", "settimeofday",
        "clock_settime", "clock_adjtime", "sethostname", "setdomainname", "vhangup",
        "open_by_handle_at", "name_to_handle_at", "iopl", "ioperm", "fanotify_init",
        "lookup_dcookie", "uselib", "ustat", "sysfs",
    ),
}
# clone flags that create a namespace; clone3 passes its flags in memory a filter cannot read,
# so it answers ENOSYS and the C library falls back to clone, whose flags it can.
_CLONE_NEW_NAMESPACES = (
    0x00020000  # CLONE_NEWNS
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x04000000  # CLONE_NEWUTS
    | 0x08000000  # CLONE_NEWIPC
    | 0x10000000  # CLONE_NEWUSER
    | 0x20000000  # CLONE_NEWPID
    | 0x40000000  # CLONE_NEWNET
)


def _deny_namespaces(f: pyseccomp.SyscallFilter) -> None:
    for name in ("unshare", "setns"):
        f.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
    for bit in range(32):
        flag = 1 << bit
        if _CLONE_NEW_NAMESPACES & flag:
            f.add_rule(pyseccomp.ERRNO(errno.EPERM), "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, flag, flag))
    f.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")


def _build(namespaces_only: bool) -> pyseccomp.SyscallFilter:
    if pyseccomp is None:
        raise SandboxUnavailable(_MISSING)
    f = pyseccomp.SyscallFilter(defaction=pyseccomp.ALLOW)
    _deny_namespaces(f)
    if not namespaces_only:
        for names in DENIED.values():
            for name in names:
                if name not in ("unshare", "setns"):
                    f.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
    return f


@functools.cache
def program() -> bytes:
    """The sandbox's filter as a classic BPF program (``struct sock_filter`` array).

    Raises ``SandboxUnavailable`` where libseccomp is missing (then namespaces are not used).
    """
    return _export(_build(namespaces_only=False))


def _export(f: pyseccomp.SyscallFilter) -> bytes:
    fd = os.memfd_create("rlx-seccomp-build", os.MFD_CLOEXEC)
    with os.fdopen(fd, "w+b") as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


def program_fd() -> int:
    """A fresh memfd at offset 0 holding ``program()``, for bwrap's ``--seccomp FD``."""
    fd = os.memfd_create("rlx-seccomp", os.MFD_CLOEXEC)
    os.write(fd, program())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def deny_namespaces_here() -> None:
    """Load a filter that denies creating namespaces into the calling process (irreversible).

    Only for a child about to exec a namespaces probe (``preexec_fn``): it makes the probe fail
    for real, which is how tests force the fallback to the ``rlimits`` level.
    """
    _build(namespaces_only=True).load()
