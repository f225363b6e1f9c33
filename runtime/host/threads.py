"""The thread runner: a run's workers as threads of the host's process (``workers.mode =
"threads"``), each running the one worker loop against the host's front.

The threads share the host's session (its model, task and compiled programs): the first
inference worker takes the session's engine, the others engines of the same shape. The first
error in any thread stops the run and is raised by :meth:`ThreadRunner.join`. A thread is alive
as long as the host's process: the host's watch loop heartbeats for every thread, naming what it
has in hand, just before it expires silent leases (``beat``), so a generation or a step longer
than the lease timeout keeps its worker and its leases.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from ledger import events as ev
from runtime.host.front import Front
from runtime.host.port import Joined, RunInfo, Standing, Submitted, Work
from runtime.host.roles import Role, Working
from runtime.host.worker import Backoff, run_worker


class ThreadPort:
    """The run's front as the worker threads of this process see it (a ``ControllerPort``): it
    keeps the secret each of its joins answered and carries it on every call under that worker
    id; a poll stops waiting once ``stop`` is set (the run is stopping)."""

    def __init__(self, front: Front, stop: threading.Event | None = None):
        self.front, self.stop = front, stop or threading.Event()
        self.secrets: dict[str, str] = {}  # worker id -> its secret

    def describe(self) -> RunInfo:
        return self.front.describe()

    def join(self, worker_id: str, role: str, *, slots: int = 1, info: dict | None = None) -> Joined:
        joined = self.front.join(worker_id, role, slots=slots, info=info)
        if joined.secret:
            self.secrets[joined.worker_id] = joined.secret
        return joined

    def poll(self, worker_id: str, *, max_items: int = 512, wait_s: float = 5.0) -> Work:
        return self.front.poll(worker_id, self.secrets.get(worker_id, ""), max_items=max_items, wait_s=wait_s,
                               active=lambda: not self.stop.is_set())

    def submit(self, worker_id: str, events: Sequence[ev.Event]) -> Submitted:
        return self.front.submit(worker_id, self.secrets.get(worker_id, ""), events)

    def heartbeat(self, worker_id: str, *, rollouts: Iterable[int] = (), steps: Iterable[int] = ()) -> Standing:
        return self.front.heartbeat(worker_id, self.secrets.get(worker_id, ""), rollouts=rollouts, steps=steps)

    def leave(self, worker_id: str, reason: str) -> None:
        self.front.leave(worker_id, self.secrets.get(worker_id, ""), reason)


class ThreadRunner:
    """Runs the workers of ``session``'s config as threads of this process (see the module
    docstring); ``roles`` (``(worker id, role)`` pairs) replaces them where given."""

    def __init__(self, session=None, roles: Iterable[tuple[str, Role]] | None = None):
        self.session = session
        self.roles = None if roles is None else list(roles)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.threads: list[threading.Thread] = []
        self.port: ThreadPort | None = None
        self._working: dict[str, tuple[str, Working]] = {}  # worker -> (the id it is joined under, its work)

    def attach(self, host) -> None:
        """Start the workers against ``host``'s front."""
        from runtime.host.roles import roles_from_session

        roles = self.roles if self.roles is not None else roles_from_session(self.session, host.pstore)
        self.start(host.front, roles)

    def start(self, front: Front, roles: Iterable[tuple[str, Role]]) -> None:
        self.port = port = ThreadPort(front, self.stop)
        info = front.describe()
        for worker_id, role in roles:
            working = Working()
            self._working[worker_id] = (worker_id, working)

            def body(worker_id: str = worker_id, role: Role = role, working: Working = working) -> None:
                def joined(wid: str) -> None:
                    self._working[worker_id] = (wid, working)

                try:
                    run_worker(role, port, worker_id=worker_id, run_id=info.run_id, heartbeat_s=info.heartbeat_s,
                               log=lambda m: None, backoff=Backoff(0.0), stop=self.stop, working=working,
                               on_join=joined)
                except BaseException as e:  # surfaced by the host's thread
                    if self.error is None:
                        self.error = e
                    self.stop.set()

            t = threading.Thread(target=body, name=worker_id, daemon=True)
            self.threads.append(t)
            t.start()

    def stopped(self) -> bool:
        return self.stop.is_set()

    def tick(self) -> None:
        """Nothing to supervise: a thread lives as long as the process."""

    def beat(self) -> None:
        """Heartbeat for every thread, naming what it has in hand."""
        if self.port is None:
            return
        for wid, working in list(self._working.values()):
            rollouts, steps = working.get()
            self.port.heartbeat(wid, rollouts=rollouts, steps=steps)

    def abandon(self) -> None:
        self.stop.set()

    def join(self) -> None:
        """Stop the threads, wait for them, and raise the first error one of them met."""
        self.stop.set()
        for t in self.threads:
            t.join()
        if self.error is not None:
            raise self.error


__all__ = ["ThreadPort", "ThreadRunner"]
