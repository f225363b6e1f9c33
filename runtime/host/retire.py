"""Deleting retired versions from the parameter store, outside the controller's lock."""

from __future__ import annotations

import threading
from collections.abc import Iterable


class Retirer:
    """Deletes retired versions from the parameter store, outside the controller's lock.

    The controller calls it (``on_retire``) with each committed ``VersionsRetired``; that only
    queues the versions. ``sweep`` deletes them, from the host's watch loop, so file I/O never
    holds up the workers' calls. A version the evaluator has yet to load is held (``hold`` /
    ``release``) and deleted after. Versions a crash left undeleted are queued on a resume
    (``ControllerLoop.evictable_versions``).
    """

    def __init__(self, pstore) -> None:
        self.pstore = pstore
        self._queued: list[int] = []
        self._held: dict[int, int] = {}  # version -> holds: not deleted until released
        self._lock = threading.Lock()

    def __call__(self, versions: Iterable[int]) -> None:
        with self._lock:
            self._queued.extend(versions)

    def hold(self, version: int) -> None:
        """Keep ``version`` in the store until :meth:`release` (the evaluator has yet to load it)."""
        with self._lock:
            self._held[version] = self._held.get(version, 0) + 1

    def release(self, version: int) -> None:
        with self._lock:
            n = self._held.pop(version, 0) - 1
            if n > 0:
                self._held[version] = n

    def sweep(self) -> None:
        with self._lock:
            versions = [v for v in self._queued if v not in self._held]
            self._queued = [v for v in self._queued if v in self._held]
        if versions:
            present = set(self.pstore.versions())
            for v in versions:
                if v in present:
                    self.pstore.delete(v)


__all__ = ["Retirer"]
