"""The front of a hosted run: every admission rule between a worker and the controller.

:class:`Front` answers the calls of :class:`runtime.host.port.ControllerPort` over a
``ControllerLoop`` in this process, without a transport: the thread runner's port
(``runtime.host.threads.ThreadPort``) calls it directly and the gRPC service
(``runtime.service.server``) only converts its messages. So a worker is admitted by the same rules
whichever runner started it:

- a worker id is checked before anything else, and is no credential: a join answers a secret of
  that worker's own (kept here, never in the ledger, so nothing decided depends on it) which every
  later call under the id must carry (else ``WrongSecret``); an id this front never admitted
  stands ``NOT_JOINED``, whatever it claims, and every call of a worker is a heartbeat;
- a worker's ``info`` is a map of at most ``MAX_INFO_BYTES`` nested at most ``MAX_INFO_DEPTH``
  deep; joins come at most ``JOINS_PER_S`` a second after a burst of ``JOIN_BURST`` (a flood of
  joins and leaves cannot grow the ledger fast), one trainer (a gang: its rank 0) is joined at a
  time, and a worker has at most ``POLLS_PER_WORKER`` polls waiting at once (``Busy``: retry);
- a worker's role decides what it may take and submit (``runtime.host.admission``): leases for
  inference, completions to score for verifiers, steps for the trainer;
- a ``WeightsPublished`` is admitted only if the parameter store holds the version under the
  digest it names;
- a poll waits until the controller's state changes (a long poll), at most its ``wait_s``;
- a worker the controller no longer knows (declared lost, or joined before a controller
  restart) stands ``NOT_JOINED`` and joins again under a new id; a duplicate or late submission
  is rejected by the fold and never counted twice.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from ledger import events as ev
from ledger.codec import pack
from ledger.errors import CodecError
from runtime.controller.admit import UNBOUNDED, Bounds
from runtime.controller.loop import ControllerFenced, ControllerLoop
from runtime.controller.workers import INFERENCE, TRAINER, VERIFIER, Verdict
from runtime.host import admission
from runtime.host.port import AlreadyJoined, Busy, Joined, Refused, RunInfo, Standing, Submitted, Work, WrongSecret

MAX_INFO_BYTES = 16 << 10  # a real worker's info (its engine's shape, its fingerprint) is under 2 KiB
MAX_INFO_DEPTH = 16
MAX_SECRET = 128
JOIN_BURST = 256  # joins at once: a fleet starting, or joining again after a controller restart
JOINS_PER_S = 2.0  # and after a burst: a worker joins again only once it has been lost
POLLS_PER_WORKER = 2  # a worker polls one at a time; a retry may overlap the poll it gave up on


def _deeper_than(value, limit: int) -> bool:
    """Whether ``value`` nests maps and arrays more than ``limit`` deep (without recursing)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            return True
        if type(v) is dict:
            stack.extend((x, depth + 1) for x in v.values())
        elif type(v) in (list, tuple):
            stack.extend((x, depth + 1) for x in v)
    return False


def worker_info(info) -> dict:
    """``info`` (a joining worker's map, recorded in its ``WorkerJoined``) if it is within bounds."""
    info = {} if info is None else info
    if type(info) is not dict:
        raise Refused(f"a worker's info must be a map, not {type(info).__name__}")
    if _deeper_than(info, MAX_INFO_DEPTH):
        raise Refused(f"a worker's info nests deeper than {MAX_INFO_DEPTH} levels")
    try:
        size = len(pack(info))
    except CodecError as e:
        raise Refused(f"a worker's info cannot be recorded: {e}") from None
    if size > MAX_INFO_BYTES:
        raise Refused(f"a worker's info is {size} bytes; at most {MAX_INFO_BYTES} are accepted")
    return info


class Front:
    """One run's controller as its workers see it (a ``ControllerPort``). Thread-safe.

    Args:
        ctrl: the controller (the ledger's only writer).
        config: the run's config (as logged in ``RunStarted``), told by ``describe``.
        params_url: the parameter store's URL, told by ``describe``.
        params: that store, opened here: a ``WeightsPublished`` is admitted only if the store
            holds the version with the digest it names (None: not checked).
        on_accept: called with a worker id after each submission of it that was accepted.
        heartbeat_s: how often workers heartbeat while they work (default: a quarter of the
            lease timeout, from 0.05 to 5 s).
        bounds: the run's vocabulary size and ``sampling.max_tokens``, which a completion must
            keep to (``runtime.controller.admit.Bounds``; unknown limits are not checked).
    """

    def __init__(self, ctrl: ControllerLoop, *, config: dict, params_url: str, params=None,
                 on_accept: Callable[[str], None] | None = None, heartbeat_s: float | None = None,
                 bounds: Bounds = UNBOUNDED):
        self.ctrl = ctrl
        self.config = config
        self.params_url = params_url
        self.params = params
        self.on_accept = on_accept
        self.heartbeat_s = heartbeat_s or max(0.05, min(5.0, ctrl.lease_timeout_s / 4))
        self.fenced = threading.Event()  # set once a call found the controller fenced
        self._lock = threading.Lock()
        self._secrets: dict[str, bytes] = {}  # worker id -> the secret its join answered (lost ones too)
        self._polling: dict[str, int] = {}  # worker id -> its polls waiting now
        self._joins, self._joins_at = float(JOIN_BURST), time.monotonic()  # a token bucket of joins
        self.bounds = bounds

    def _standing(self, worker_id: str, known: bool = True) -> Standing:
        if self.ctrl.finished:
            return Standing.FINISHED
        return Standing.JOINED if known and self.ctrl.joined(worker_id) else Standing.NOT_JOINED

    def _caller(self, worker_id: str, secret: str) -> tuple[str, bool]:
        """The caller's worker id, and whether this front admitted it; refuses a call under an
        admitted id without the secret its join answered."""
        wid = admission.worker_id(worker_id)
        with self._lock:
            expected = self._secrets.get(wid)
        if expected is None:
            return wid, False
        given = secret.encode("utf-8", "replace")[:MAX_SECRET] if type(secret) is str else b""
        if not hmac.compare_digest(given, expected):
            raise WrongSecret(f"worker {wid!r} joined under another secret: each call under a worker id must "
                              "carry the secret its join answered")
        return wid, True

    def _take_join(self) -> None:
        """One join out of the bucket, or ``Busy``."""
        now = time.monotonic()
        with self._lock:
            self._joins = min(float(JOIN_BURST), self._joins + (now - self._joins_at) * JOINS_PER_S)
            self._joins_at = now
            if self._joins < 1.0:
                raise Busy(f"more joins than {JOINS_PER_S:g} a second after a burst of {JOIN_BURST}; join again later")
            self._joins -= 1.0

    def _trainer(self, but: str) -> str | None:
        """The joined trainer other than ``but``, if there is one."""
        return next((w for w, s in self.ctrl.state.workers.items() if s.role == TRAINER and w != but), None)

    def _role(self, worker_id: str) -> str | None:
        w = self.ctrl.state.workers.get(worker_id)
        return None if w is None else w.role

    def _check_weights(self, e: ev.WeightsPublished) -> None:
        """Refuse a claim the parameter store does not back: the version absent, or another digest."""
        store = self.params
        if e.version not in store.versions():
            raise Refused(f"version {e.version} is not in the parameter store {store.url}")
        stored = store.digest(e.version)
        if stored != e.digest:
            raise Refused(f"version {e.version} in the parameter store has digest {stored[:16]}")

    def _fenced(self, e: ControllerFenced) -> ControllerFenced:
        self.fenced.set()
        return e

    # -- the calls of a port (``runtime.host.port``), each after join with the worker's secret --------

    def describe(self) -> RunInfo:
        ctrl = self.ctrl
        return RunInfo(Standing.FINISHED if ctrl.finished else Standing.JOINED, ctrl.run_id, self.config,
                       self.params_url, ctrl.epoch, self.heartbeat_s)

    def join(self, worker_id: str, role: str, *, slots: int = 1, info: dict | None = None) -> Joined:
        """Join ``worker_id`` under ``role``; the answer carries the secret of its later calls."""
        wid = admission.worker_id(worker_id)
        admission.joining(role, slots)
        info = worker_info(info)
        ctrl = self.ctrl
        if ctrl.finished:
            return Joined(Standing.FINISHED, wid, ctrl.epoch)
        secret = secrets.token_urlsafe(24)
        try:
            with ctrl.exclusive():  # no other trainer joins between the check and the join
                trainer = self._trainer(wid) if role == TRAINER else None
                if trainer is not None:
                    raise Busy(f"trainer {trainer!r} is joined and a run has one trainer (a gang joins as its "
                               "rank 0): join again once it has left or been lost")
                self._take_join()
                verdict = ctrl.join(wid, role, slots=slots, info=info)
        except ControllerFenced as e:
            raise self._fenced(e) from None
        if not verdict.accepted:
            raise AlreadyJoined(verdict.reason or "rejected")
        with self._lock:
            self._secrets[wid] = secret.encode("ascii")
        return Joined(Standing.JOINED, wid, ctrl.epoch, secret)

    def poll(self, worker_id: str, secret: str, *, max_items: int = 512, wait_s: float = 5.0,
             active: Callable[[], bool] = lambda: True) -> Work:
        """The worker's work, waiting up to ``wait_s`` (at most ``admission.MAX_WAIT_S``) for
        some while ``active()`` (the caller is still there)."""
        wid, known = self._caller(worker_id, secret)
        if not known:
            return Work(self._standing(wid, known))
        with self._lock:
            if self._polling.get(wid, 0) >= POLLS_PER_WORKER:
                raise Busy(f"worker {wid!r} has {POLLS_PER_WORKER} polls waiting already; poll again once they "
                           "are answered")
            self._polling[wid] = self._polling.get(wid, 0) + 1
        try:
            return self._poll(wid, max_items, wait_s, active)
        finally:
            with self._lock:
                self._polling[wid] -= 1
                if not self._polling[wid]:
                    del self._polling[wid]

    def _poll(self, wid: str, max_items: int, wait_s: float, active: Callable[[], bool]) -> Work:
        wait = min(max(0.0, wait_s), admission.MAX_WAIT_S)
        limit = min(max_items or 512, admission.MAX_POLL_ITEMS)
        deadline = time.monotonic() + wait
        ctrl = self.ctrl
        while True:
            if ctrl.fenced:  # hand out nothing more: the workers go to the newer controller
                raise self._fenced(ControllerFenced(ctrl.fenced))
            seq = ctrl.head_seq
            standing = self._standing(wid)
            if standing != Standing.JOINED:
                return Work(standing)
            role = self._role(wid)
            if role == INFERENCE:
                leases = ctrl.leases(wid)
                if leases:
                    return Work(standing, leases=tuple(leases))
            elif role == VERIFIER:
                tasks = ctrl.scoring_work(wid, limit)
                if tasks:
                    return Work(standing, scores=tuple(tasks))
            elif role == TRAINER:
                task = ctrl.train_task(wid)
                if task is not None:
                    return Work(standing, train=task)
            left = deadline - time.monotonic()
            if left <= 0 or not active():
                return Work(standing)
            ctrl.wait_for_change(seq, min(left, 1.0))

    def submit(self, worker_id: str, secret: str, events: Sequence[ev.Event]) -> Submitted:
        wid, known = self._caller(worker_id, secret)
        if not known:  # nothing of a worker this front never admitted is recorded
            reason = f"worker {wid!r} has not joined this controller; join again"
            return Submitted(self._standing(wid, known), tuple(Verdict(False, reason) for _ in events))
        role = self._role(wid)
        if role is None:  # lost or never joined: its results may still be valid (the fold decides)
            role = admission.role_of(events)
        events = admission.submission(events, role, wid, self.bounds)
        ctrl = self.ctrl
        try:
            ctrl.heartbeat(wid)
            if self.params is not None:
                for e in events:
                    if type(e) is ev.WeightsPublished:
                        self._check_weights(e)
            if role == INFERENCE:
                verdicts = ctrl.complete(events)  # type: ignore[arg-type]
            elif role == VERIFIER:
                verdicts = ctrl.record_outcomes(events)  # type: ignore[arg-type]
            else:
                verdicts = ctrl.publish(events, worker_id=wid)  # type: ignore[arg-type]
        except ControllerFenced as e:
            raise self._fenced(e) from None
        if self.on_accept is not None and any(v.accepted for v in verdicts):
            self.on_accept(wid)
        return Submitted(self._standing(wid), tuple(verdicts))

    def heartbeat(self, worker_id: str, secret: str, *, rollouts: Iterable[int] = (),
                  steps: Iterable[int] = ()) -> Standing:
        wid, known = self._caller(worker_id, secret)
        if not known:
            return self._standing(wid, known)
        rollouts, steps = tuple(rollouts), tuple(steps)
        if len(rollouts) > admission.MAX_POLL_ITEMS or len(steps) > admission.MAX_POLL_ITEMS:
            raise Refused(f"a heartbeat names at most {admission.MAX_POLL_ITEMS} rollouts and steps")
        self.ctrl.heartbeat(wid, rollouts=rollouts, steps=steps)
        return self._standing(wid)

    def leave(self, worker_id: str, secret: str, reason: str) -> None:
        wid, known = self._caller(worker_id, secret)
        if not known:
            return
        try:
            self.ctrl.lose([wid], (reason or "left")[: admission.MAX_TEXT])
        except ControllerFenced as e:
            raise self._fenced(e) from None


__all__ = ["JOIN_BURST", "JOINS_PER_S", "MAX_INFO_BYTES", "MAX_INFO_DEPTH", "POLLS_PER_WORKER", "Front",
           "worker_info"]
