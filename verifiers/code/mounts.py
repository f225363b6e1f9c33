"""A fresh tmpfs per run, capped in bytes and in inodes: the run's work dir and ``/tmp``.

bubblewrap's own ``--tmpfs`` takes a size but no inode count, and empty files cost no bytes: a
program made 300,000 of them and held 300 MB of kernel memory. So each slot mounts its own
tmpfs (``size=`` and ``nr_inodes=``) before a run starts and detaches it when the run ends,
which also throws away everything the run wrote. The namespaces level binds its ``work`` and
``tmp`` directories into the sandbox; the rlimits level runs in them directly.

The mount points live under ``/run/rlx-sandbox-fs`` (itself a private mount, so nothing mounted
below it propagates to other mount namespaces), one per slot uid; the uid's lock makes the slot
ours, so anything left mounted there by a crashed verifier is ours to detach.
"""

from __future__ import annotations

import ctypes
import os

BASE = "/run/rlx-sandbox-fs"
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_PRIVATE = 2, 4, 4096, 1 << 18
_MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: bytes, target: str, fstype: bytes | None, flags: int, data: bytes | None) -> None:
    _check(_libc.mount(source, target.encode(), fstype, flags, data), f"mount {target}")


def _detach_all(path: str) -> None:
    while _libc.umount2(path.encode(), _MNT_DETACH) == 0:
        pass


def _is_mount_point(path: str) -> bool:
    """Whether something is mounted at ``path`` (a bind of the same file system included,
    which ``os.path.ismount`` cannot tell)."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return any(line.split()[4] == path for line in f)


def _private_base() -> None:
    os.makedirs(BASE, mode=0o711, exist_ok=True)
    os.chmod(BASE, 0o711)  # the rlimits level's uids must pass through (not list) it
    if not _is_mount_point(BASE):
        _mount(BASE.encode(), BASE, None, _MS_BIND, None)
    _mount(b"none", BASE, None, _MS_PRIVATE, None)


class SlotFs:
    """The tmpfs mount point of one slot; ``mount`` before each run, ``detach`` after it."""

    def __init__(self, uid: int):
        _private_base()
        self.uid = uid
        self.root = os.path.join(BASE, str(uid))
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        _detach_all(self.root)  # left by a verifier that died holding this uid
        self.work = os.path.join(self.root, "work")
        self.tmp = os.path.join(self.root, "tmp")

    def mount(self, size_bytes: int, inodes: int, *, owner: int | None) -> None:
        """A fresh tmpfs with empty ``work`` and ``tmp`` dirs.

        ``owner``: the uid that owns both dirs (mode 0700); None: root-owned, mode 1777 (they are
        bound into a sandbox whose program runs as some other uid).
        """
        options = f"size={size_bytes},nr_inodes={inodes},mode=0711".encode()
        _mount(b"tmpfs", self.root, b"tmpfs", _MS_NOSUID | _MS_NODEV, options)
        try:
            for path in (self.work, self.tmp):
                os.mkdir(path)
                if owner is None:
                    os.chmod(path, 0o1777)
                else:
                    os.chown(path, owner, owner)
                    os.chmod(path, 0o700)
        except BaseException:
            self.detach()
            raise

    def detach(self) -> None:
        """Detach the run's tmpfs; the kernel frees it once no sandbox still sees it."""
        _detach_all(self.root)

