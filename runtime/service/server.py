"""The controller's gRPC service: a task queue over a ``ControllerLoop``.

Workers ``Describe`` the run, ``Join`` with a role, then long-poll (``Poll`` waits until the
controller's state changes or the wait ends), ``Submit`` results and ``Heartbeat`` while they
work. Every call counts as a heartbeat. A submission is checked (``wire.submitted``) and then
admitted by the controller like any other input, so a duplicate or late one is rejected by the
fold and never counted twice. A worker the controller no longer knows (declared lost, or joined
before a controller restart) is told ``NOT_JOINED`` and joins again under a new id.

Who may call is ``verifiers.service.security``'s business: loopback by default, a bearer token
for any other address (and, with ``rlx run``, always: each run has its own token), TLS by flags.
"""

from __future__ import annotations

import concurrent.futures
import re
import threading
import time
from collections.abc import Callable

import grpc

from ledger import events as ev
from runtime._generated import rlx_controller_pb2 as pb
from runtime._generated import rlx_controller_pb2_grpc as pb_grpc
from runtime.controller.loop import ControllerFenced, ControllerLoop
from runtime.controller.workers import INFERENCE, ROLES, TRAINER, VERIFIER, InitTask
from runtime.service import wire
from verifiers.service.security import EXCLUSIVE_PORT, ListenAddress, ServerSecurity

MAX_THREADS = 256  # a long poll holds a thread for up to its wait: about one per worker
MAX_CONCURRENT_RPCS = 1024
_WORKER_ID = re.compile(r"[A-Za-z0-9_.:@~+-]{1,128}")

OPTIONS = [
    ("grpc.max_receive_message_length", wire.MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", wire.MAX_MESSAGE_BYTES),
]
KEEPALIVE_S = 5.0
"""A worker pings its connection every ``KEEPALIVE_S`` while a call is in flight and drops it when
a ping goes unanswered as long: a controller that is paused or cut off (its socket open, its
process silent) costs a worker seconds, not a call's whole deadline, before it fails over."""
PINGS_ACCEPTED = [  # take those pings: by gRPC's keepalive guide a server allows one per 5 minutes while it
    # sends no data (a quiet long poll sends none) and hangs up after two more
    ("grpc.http2.min_recv_ping_interval_without_data_ms", int(KEEPALIVE_S * 1000 * 0.8)),
    ("grpc.http2.max_ping_strikes", 0),
]


class ControllerService(pb_grpc.ControllerServicer):
    """Serves one run's controller to its workers.

    Args:
        ctrl: the controller (the ledger's only writer).
        config: the run's config (as logged in ``RunStarted``), sent to workers by ``Describe``.
        params_url: the parameter store's URL, sent to workers.
        params: that store, opened here: a ``WeightsPublished`` is admitted only if the store
            holds the version with the digest it names (None: not checked).
        on_accept: called with a worker id after each submission of it that was accepted.
        heartbeat_s: how often workers heartbeat while they work.
    """

    def __init__(self, ctrl: ControllerLoop, *, config: dict, params_url: str,
                 params=None,
                 on_accept: Callable[[str], None] | None = None, heartbeat_s: float | None = None):
        self.ctrl = ctrl
        self.config_bytes = wire.pack_map(config)
        self.params_url = params_url
        self.params = params
        self.on_accept = on_accept
        self.heartbeat_s = heartbeat_s or max(0.05, min(5.0, ctrl.lease_timeout_s / 4))
        self.fenced = threading.Event()

    # -- helpers --------------------------------------------------------------------------------

    def _standing(self, worker_id: str) -> int:
        if self.ctrl.finished:
            return pb.FINISHED
        return pb.JOINED if self.ctrl.joined(worker_id) else pb.NOT_JOINED

    def _guard(self, context, fn):
        try:
            return fn()
        except wire.WireError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except ControllerFenced as e:
            self.fenced.set()
            context.abort(grpc.StatusCode.UNAVAILABLE, str(e))

    @staticmethod
    def _worker_id(worker_id: str) -> str:
        if not _WORKER_ID.fullmatch(worker_id):
            raise wire.WireError(f"worker id {worker_id[:40]!r} must be 1 to 128 characters of A-Z a-z 0-9 _ . : @ ~ + -")
        return worker_id

    def _check_weights(self, e: ev.WeightsPublished) -> None:
        """Refuse a claim the parameter store does not back: the version absent, or another digest."""
        store = self.params
        if e.version not in store.versions():
            raise wire.WireError(f"version {e.version} is not in the parameter store {store.url}")
        stored = store.digest(e.version)
        if stored != e.digest:
            raise wire.WireError(f"version {e.version} in the parameter store has digest {stored[:16]}")

    def _role(self, worker_id: str) -> str | None:
        w = self.ctrl.state.workers.get(worker_id)
        return None if w is None else w.role

    # -- RPCs -----------------------------------------------------------------------------------

    def Describe(self, request, context):
        s = self.ctrl.state
        return pb.RunInfo(standing=pb.FINISHED if s.finished else pb.JOINED, run_id=self.ctrl.run_id,
                          config=self.config_bytes, params_url=self.params_url, epoch=self.ctrl.epoch,
                          heartbeat_s=self.heartbeat_s)

    def Join(self, request, context):
        def join():
            wid = self._worker_id(request.worker_id)
            if request.role not in ROLES:
                raise wire.WireError(f"role {request.role[:40]!r} is not accepted; accepted: {', '.join(ROLES)}")
            if not 1 <= request.slots <= wire.MAX_SLOTS:
                raise wire.WireError(f"slots {request.slots} must be from 1 to {wire.MAX_SLOTS}")
            info = wire.unpack_map(request.info, "worker info", wire.MAX_INFO_BYTES)
            if self.ctrl.finished:
                return pb.JoinReply(standing=pb.FINISHED, worker_id=wid, epoch=self.ctrl.epoch)
            verdict = self.ctrl.join(wid, request.role, slots=request.slots, info=info)
            if not verdict.accepted:
                context.abort(grpc.StatusCode.ALREADY_EXISTS, verdict.reason or "rejected")
            return pb.JoinReply(standing=pb.JOINED, worker_id=wid, epoch=self.ctrl.epoch)

        return self._guard(context, join)

    def Poll(self, request, context):
        def poll():
            wid = self._worker_id(request.worker_id)
            wait = min(max(0.0, request.wait_s), wire.MAX_WAIT_S)
            remaining = context.time_remaining()
            if remaining is not None:
                wait = min(wait, max(0.0, remaining - 0.5))
            limit = min(request.max or 512, wire.MAX_POLL_ITEMS)
            deadline = time.monotonic() + wait
            ctrl = self.ctrl
            while True:
                if ctrl.fenced:  # hand out nothing more: the workers go to the newer controller
                    raise ControllerFenced(ctrl.fenced)
                seq = ctrl.head_seq
                standing = self._standing(wid)
                if standing != pb.JOINED:
                    return pb.PollReply(standing=standing)
                role = self._role(wid)
                reply = pb.PollReply(standing=pb.JOINED)
                if role == INFERENCE:
                    leases = ctrl.leases(wid)
                    if leases:
                        reply.leases.extend(wire.lease_to_proto(lease) for lease in leases)
                        return reply
                elif role == VERIFIER:
                    tasks = ctrl.scoring_work(wid, limit)
                    if tasks:
                        reply.scores.extend(wire.score_to_proto(t) for t in tasks)
                        return reply
                elif role == TRAINER:
                    task = ctrl.train_task(wid)
                    if task is not None:
                        reply.train.CopyFrom(wire.train_to_proto(None if isinstance(task, InitTask) else task))
                        return reply
                left = deadline - time.monotonic()
                if left <= 0 or not context.is_active():
                    return reply
                ctrl.wait_for_change(seq, min(left, 1.0))

        return self._guard(context, poll)

    def Submit(self, request, context):
        def submit():
            wid = self._worker_id(request.worker_id)
            role = self._role(wid)
            if role is None:  # lost or never joined: its results may still be valid (the fold decides)
                role = _role_of(request.events)
            events = wire.submitted(request.events, role, wid)
            ctrl = self.ctrl
            ctrl.heartbeat(wid)
            if self.params is not None:
                for e in events:
                    if type(e) is ev.WeightsPublished:
                        self._check_weights(e)
            if role == INFERENCE:
                verdicts = ctrl.complete(events)
            elif role == VERIFIER:
                verdicts = ctrl.record_outcomes(events)
            else:
                verdicts = ctrl.publish(events)
            if self.on_accept is not None and any(v.accepted for v in verdicts):
                self.on_accept(wid)
            return pb.SubmitReply(standing=self._standing(wid),
                                  verdicts=[pb.Verdict(accepted=v.accepted, reason=v.reason or "") for v in verdicts])

        return self._guard(context, submit)

    def Heartbeat(self, request, context):
        def beat():
            wid = self._worker_id(request.worker_id)
            if len(request.rollouts) > wire.MAX_POLL_ITEMS or len(request.steps) > wire.MAX_POLL_ITEMS:
                raise wire.WireError(f"a heartbeat names at most {wire.MAX_POLL_ITEMS} rollouts and steps")
            self.ctrl.heartbeat(wid, rollouts=request.rollouts, steps=request.steps)
            return pb.HeartbeatReply(standing=self._standing(wid))

        return self._guard(context, beat)

    def Leave(self, request, context):
        def leave():
            wid = self._worker_id(request.worker_id)
            self.ctrl.lose([wid], (request.reason or "left")[: wire.MAX_TEXT])
            return pb.LeaveReply()

        return self._guard(context, leave)


def _role_of(messages) -> str:
    """The role whose submissions these are (from the first event's kind), for a worker that
    is no longer joined."""
    kinds = {m.kind for m in messages}
    for role, allowed in wire.SUBMITS.items():
        if kinds and kinds <= {k.KIND for k in allowed}:  # type: ignore[attr-defined]
            return role
    raise wire.WireError("a submission mixes the results of several roles, or is empty")


class PendingService(pb_grpc.ControllerServicer):
    """A controller service that listens before its controller exists.

    ``rlx run`` starts its worker processes while it builds its own session and controller, so
    that their start-up (importing JAX, building the role, loading compiled programs) overlaps
    with its own. A call that arrives before ``attach`` waits for it, at most until shortly
    before the call's deadline; then it fails ``UNAVAILABLE``, which a worker retries. After
    ``attach`` every call goes to the attached ``ControllerService``.
    """

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._service: ControllerService | None = None

    def attach(self, service: ControllerService) -> None:
        self._service = service
        self._ready.set()

    def _attached(self, context) -> ControllerService:
        remaining = context.time_remaining()
        if not self._ready.wait(wire.MAX_WAIT_S if remaining is None else max(0.0, remaining - 0.5)):
            context.abort(grpc.StatusCode.UNAVAILABLE, "the run is starting; retry")
        assert self._service is not None
        return self._service

    def Describe(self, request, context):
        return self._attached(context).Describe(request, context)

    def Join(self, request, context):
        return self._attached(context).Join(request, context)

    def Poll(self, request, context):
        return self._attached(context).Poll(request, context)

    def Submit(self, request, context):
        return self._attached(context).Submit(request, context)

    def Heartbeat(self, request, context):
        return self._attached(context).Heartbeat(request, context)

    def Leave(self, request, context):
        return self._attached(context).Leave(request, context)


class Served:
    """A running controller service: ``port``, ``stop()``."""

    def __init__(self, server: grpc.Server, port: int, service: pb_grpc.ControllerServicer):
        self.server = server
        self.port = port
        self.service = service

    def stop(self, grace: float = 1.0) -> None:
        self.server.stop(grace).wait()


def serve(service: pb_grpc.ControllerServicer, address: ListenAddress, security: ServerSecurity = ServerSecurity(),
          *, threads: int = MAX_THREADS) -> Served:
    """Start serving ``service`` on ``address`` (checked by ``security``: a token off loopback)."""
    server = grpc.server(
        concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rlx-controller"),
        interceptors=security.interceptors(), options=[*OPTIONS, *PINGS_ACCEPTED, EXCLUSIVE_PORT],
        maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS,
    )
    pb_grpc.add_ControllerServicer_to_server(service, server)
    port = security.bind(server, address)
    server.start()
    return Served(server, port, service)
