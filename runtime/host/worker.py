"""The one worker loop: join, long-poll for work, do it, submit the results; for every role and
both runners.

A worker thread of ``rlx run`` runs it against the run's ``Front`` in the same process; an
``rlx worker`` process runs it against a ``ControllerClient`` (gRPC). A heartbeat thread names
what the worker has in hand every ``heartbeat_s``, so work longer than the lease timeout is
neither taken away nor done twice. When the controller cannot be reached (``Disconnected``, over
gRPC only) the worker backs off and retries, the next address first, keeping results it has not
delivered; when the controller does not know it (declared lost, or a new controller took over,
whose front knows none of the secrets the old one gave) it joins again under a new id
(``ID~N``). The port keeps the secret each join answered and carries it on that id's calls.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ledger import events as ev
from runtime.errors import RlxError
from runtime.host.port import AlreadyJoined, ControllerPort, Disconnected, Standing
from runtime.host.roles import Role, Working

Log = Callable[[str], None]
POLL_WAIT_S = 5.0
BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 5.0


class ControllerGone(RlxError):
    """No controller answered for longer than the worker is willing to wait."""


class Backoff:
    """Doubling waits from ``BACKOFF_FIRST_S`` to ``BACKOFF_MAX_S``; gives up after ``limit_s``."""

    def __init__(self, limit_s: float):
        self.limit_s = limit_s
        self.reset()

    def reset(self) -> None:
        self.wait = BACKOFF_FIRST_S
        self.since: float | None = None

    def sleep(self, why: str) -> None:
        now = time.monotonic()
        if self.since is None:
            self.since = now
        elif now - self.since > self.limit_s:
            raise ControllerGone(f"no controller answered for {now - self.since:.0f} s (last: {why})")
        time.sleep(self.wait)
        self.wait = min(self.wait * 2, BACKOFF_MAX_S)


def fail_over(port: ControllerPort) -> None:
    """Move ``port`` to its next address, if it has several (a gRPC client)."""
    move = getattr(port, "fail_over", None)
    if move is not None:
        move()


def retry_later(port: ControllerPort, backoff: Backoff, error: Disconnected) -> None:
    """No controller answered: the next address, after the backoff's wait."""
    fail_over(port)
    backoff.sleep(str(error))


class _Heartbeat(threading.Thread):
    """Heartbeats every ``period_s`` with what is in hand; notes when the controller has lost
    the worker or the run has finished."""

    def __init__(self, port: ControllerPort, worker_id: str, working: Working, period_s: float):
        super().__init__(name=f"heartbeat-{worker_id}", daemon=True)
        self.port, self.worker_id, self.working, self.period_s = port, worker_id, working, period_s
        self.stop = threading.Event()
        self.standing = Standing.JOINED

    def run(self) -> None:
        while not self.stop.wait(self.period_s):
            rollouts, steps = self.working.get()
            try:
                self.standing = self.port.heartbeat(self.worker_id, rollouts=rollouts, steps=steps)
            except Disconnected:
                fail_over(self.port)
            except RlxError:
                return


def run_worker(work: Role, port: ControllerPort, *, worker_id: str, run_id: str, heartbeat_s: float,
               log: Log = print, backoff: Backoff | None = None, beat_port: ControllerPort | None = None,
               stop: threading.Event | None = None, working: Working | None = None,
               on_join: Callable[[str], None] | None = None) -> int:
    """Serve the run behind ``port`` as ``work``'s role until it finishes (returns 0) or
    ``stop`` is set (returns 1).

    ``beat_port``: the port the heartbeat thread calls (a gRPC worker gives it a connection of
    its own; default ``port``). ``backoff``: how long to go on calling a controller that does not
    answer (default 600 s). ``working``: where the worker notes what it has in hand (for a host
    that also heartbeats for it); ``on_join``: told each id the worker joins under.
    """
    backoff = backoff or Backoff(600.0)
    working = working or Working()
    stop = stop or threading.Event()
    pending: list[tuple[str, list[ev.Event]]] = []  # results not yet delivered, by the id that made them
    attempt = 0
    while not stop.is_set():
        wid = worker_id if attempt == 0 else f"{worker_id}~{attempt}"
        attempt += 1
        try:
            joined = port.join(wid, work.role, slots=work.slots, info=work.info)
        except AlreadyJoined:
            continue
        except Disconnected as e:
            retry_later(port, backoff, e)
            continue
        backoff.reset()
        if joined.standing == Standing.FINISHED:
            return 0
        work.rename(wid)
        if on_join is not None:
            on_join(wid)
        log(f"{wid} joined run {run_id!r} (controller epoch {joined.epoch})")
        if _serve(work, port, beat_port or port, wid, heartbeat_s, pending, backoff, stop, working):
            return 0
    return 1


def _serve(work: Role, port: ControllerPort, beat_port: ControllerPort, wid: str, heartbeat_s: float,
           pending: list[tuple[str, list[ev.Event]]], backoff: Backoff, stop: threading.Event,
           working: Working) -> bool:
    """Work as ``wid`` until the run finishes (True) or the worker must join again or stop (False)."""
    beat = _Heartbeat(beat_port, wid, working, heartbeat_s)
    beat.start()
    try:
        while not stop.is_set():
            if pending:
                maker, events = pending[0]
                try:
                    reply = port.submit(maker, events)
                except Disconnected as e:
                    retry_later(port, backoff, e)
                    continue
                del pending[0]
                if reply.standing == Standing.FINISHED:
                    return True
                continue
            try:
                polled = port.poll(wid, max_items=work.max_items, wait_s=POLL_WAIT_S)
            except Disconnected as e:
                retry_later(port, backoff, e)
                continue
            backoff.reset()
            if polled.standing == Standing.FINISHED:
                return True
            if polled.standing == Standing.NOT_JOINED or beat.standing == Standing.NOT_JOINED:
                return False
            try:
                done = work.work(polled, working)
            finally:
                working.set()
            if done:
                pending.append((wid, done))
        return False
    finally:
        beat.stop.set()


__all__ = ["Backoff", "ControllerGone", "POLL_WAIT_S", "run_worker"]
