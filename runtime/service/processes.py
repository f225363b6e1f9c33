"""The process runner: a run's workers as ``rlx worker`` processes that the host supervises,
serving its front to them over gRPC on loopback with a token of the run's own.

``rlx run`` starts them before it builds its own session: their start-up (importing JAX, building
their role, loading compiled programs) overlaps with its own instead of coming after it. Until
:meth:`ProcessRunner.attach` gives the service its host, their first calls wait
(``PendingService``); they wait as long as the host builds, and exit with it. A dead worker is
noticed at once, its loss recorded and a new one started (``runtime.service.supervisor``).
"""

from __future__ import annotations

import os
from typing import Any

from runtime.config import Config
from runtime.errors import UsageError
from runtime.placement import Layout


class ProcessRunner:
    """The worker processes of ``config``'s ``workers`` section for the run in directory ``out``,
    each shown only its devices of ``layout`` (``runtime.placement``)."""

    RETRY_FOR_S = 24 * 3600.0

    def __init__(self, config: Config, out: str, layout: Layout) -> None:
        import secrets

        from runtime.service.server import PendingService, serve
        from runtime.service.supervisor import Journal, Supervisor
        from verifiers.service.security import TOKEN_ENV, ListenAddress, ServerSecurity

        logs, journal = os.path.join(out, "logs"), os.path.join(out, "workers.jsonl")
        self.logs = logs
        self._created = [p for p in (out, logs, journal) if not os.path.lexists(p)]
        self.host: Any = None
        self._stopped = False
        token = secrets.token_urlsafe(32)
        self.pending = PendingService()
        self.served = serve(self.pending, ListenAddress("127.0.0.1", 0), ServerSecurity(token=token))
        w = config.workers
        self.supervisor = Supervisor(
            f"127.0.0.1:{self.served.port}", [("trainer", 1), ("verifier", w.verifiers), ("inference", w.inference)],
            log_dir=logs, journal=Journal(journal), lose=self._lose, joined_ids=self._joined_ids,
            env={TOKEN_ENV: token}, retry_for_s=self.RETRY_FOR_S, gangs={"trainer": w.trainer_processes},
            placed=lambda slot, rank: layout.env(_process(slot, rank), os.environ))
        try:
            self.supervisor.start()
        except BaseException:
            self.abandon()
            raise

    def _lose(self, ids, reason: str) -> None:
        if self.host is not None:
            self.host.ctrl.lose(ids, reason)

    def _joined_ids(self) -> tuple[str, ...]:
        return () if self.host is None else tuple(self.host.ctrl.state.workers.keys())

    def attach(self, host) -> None:
        """Serve ``host``'s front to the workers."""
        from runtime.service.server import ControllerService

        self.host = host
        host.front.on_accept = self.supervisor.delivered
        self.pending.attach(ControllerService(host.front))
        host.log(f"workers: {len(self.supervisor.slots)} processes (their output in {self.logs})")

    def stopped(self) -> bool:
        return self.supervisor.failure is not None or (self.host is not None and self.host.front.fenced.is_set())

    def tick(self) -> None:
        self.supervisor.poll()

    def beat(self) -> None:
        """Nothing: a worker process heartbeats for itself."""

    def join(self) -> None:
        """Let the workers finish (they exit when the run has finished), stop the rest and the
        service; raise what stopped the run early, if anything did."""
        self.stop()
        if self.supervisor.failure is not None:
            raise UsageError(self.supervisor.failure)
        if self.host is not None and self.host.front.fenced.is_set():
            from runtime.controller.loop import ControllerFenced

            ctrl = self.host.ctrl
            raise ControllerFenced(f"controller of run {ctrl.run_id!r} at epoch {ctrl.epoch} is fenced by a newer one")

    def stop(self) -> None:
        """Stop the workers and the service. Workers that never had a host are stopped at once."""
        from runtime.service.supervisor import STOP_GRACE_S

        if not self._stopped:
            self._stopped = True
            self.supervisor.stop(STOP_GRACE_S if self.host is not None else 0.0)
            self.served.stop()

    def abandon(self) -> None:
        """Stop everything and remove what was created for the workers (their logs, the journal,
        the run directory if it was made for them): the run was never recorded."""
        import shutil

        self._stopped = True
        self.supervisor.stop(0.0)
        self.served.stop(0.0)
        for path in reversed(self._created):
            if os.path.isdir(path) and not os.path.islink(path):
                if os.path.basename(path) == "logs":
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    try:
                        os.rmdir(path)  # the run directory, when nothing else is in it
                    except OSError:
                        pass
            elif os.path.lexists(path):
                os.remove(path)


def _process(slot: str, rank: int) -> str:
    """A supervisor slot's child (``trainer-0`` rank R, ``inference-N``, ``verifier-N``) as a
    process of the layout."""
    role, _, index = slot.rpartition("-")
    if role == "trainer":
        return f"trainer.{rank}"
    return slot if role == "inference" else role


__all__ = ["ProcessRunner"]
