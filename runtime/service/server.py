"""The controller's gRPC service: a task queue over a ``ControllerLoop``.

Workers ``Describe`` the run, ``Join`` with a role, then long-poll (``Poll`` waits until the
controller's state changes or the wait ends), ``Submit`` results and ``Heartbeat`` while they
work. This module only converts messages: every rule of who may do what is the run's
``runtime.host.front.Front``, the same for a worker thread of ``rlx run`` as for a process here.

Who may call is ``verifiers.service.security``'s business: loopback by default, a bearer token
for any other address (and, with ``rlx run``, always: each run has its own token), TLS by flags.
The token is checked before a request's body is read. What a request may cost is bounded here:
gRPC refuses any request over ``OPTIONS``' receive limit (Submit's) from its length alone, each
method refuses one over its own ``RECEIVE_BYTES`` before parsing it, and long polls take at most
``POLL_SHARE`` of the handler threads, so a heartbeat never waits behind them.
"""

from __future__ import annotations

import concurrent.futures
import threading

import grpc

from runtime._generated import rlx_controller_pb2 as pb
from runtime._generated import rlx_controller_pb2_grpc as pb_grpc
from runtime.controller.loop import ControllerFenced
from runtime.host.front import MAX_INFO_BYTES, Front
from runtime.host.port import AlreadyJoined, Busy, Refused, WrongSecret
from runtime.service import wire
from verifiers.service.security import EXCLUSIVE_PORT, ListenAddress, ServerSecurity

MAX_THREADS = 256  # a long poll holds a thread for up to its wait: about one per worker
POLL_SHARE = 0.75  # of the threads, the most long polls may hold at once (192): the rest answer other calls
MAX_CONCURRENT_RPCS = 1024
RECEIVE_BYTES = {  # the most one request of each method may be: what a real worker sends, with room
    "Describe": 1 << 10,
    "Join": MAX_INFO_BYTES + (4 << 10),  # its info and a few short fields
    "Poll": 4 << 10,
    "Heartbeat": 2 << 20,  # up to MAX_POLL_ITEMS rollouts and as many steps, at most 10 bytes each
    "Leave": 8 << 10,
    "Submit": wire.MAX_MESSAGE_BYTES,  # a batch of completions
}

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
    """Serves one run's ``Front`` to its workers over gRPC: converts each message and the
    front's refusals (``WrongSecret``: ``PERMISSION_DENIED``, ``Refused``: ``INVALID_ARGUMENT``,
    ``AlreadyJoined``: ``ALREADY_EXISTS``, ``Busy``: ``RESOURCE_EXHAUSTED``, a fenced controller:
    ``UNAVAILABLE``). Every rule is the front's."""

    def __init__(self, front: Front):
        self.front = front
        self.config_bytes = wire.pack_map(front.config)

    @staticmethod
    def _guard(context, fn):
        try:
            return fn()
        except WrongSecret as e:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, str(e))
        except Refused as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except AlreadyJoined as e:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, str(e))
        except Busy as e:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        except ControllerFenced as e:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(e))

    # -- RPCs -----------------------------------------------------------------------------------

    def Describe(self, request, context):
        info = self.front.describe()
        return pb.RunInfo(standing=int(info.standing), run_id=info.run_id, config=self.config_bytes,
                          params_url=info.params_url, epoch=info.epoch, heartbeat_s=info.heartbeat_s)

    def Join(self, request, context):
        def join():
            info = wire.unpack_map(request.info, "worker info", wire.MAX_INFO_BYTES)
            joined = self.front.join(request.worker_id, request.role, slots=request.slots, info=info)
            return pb.JoinReply(standing=int(joined.standing), worker_id=joined.worker_id, epoch=joined.epoch,
                                secret=joined.secret)

        return self._guard(context, join)

    def Poll(self, request, context):
        def poll():
            wait = request.wait_s
            remaining = context.time_remaining()
            if remaining is not None:
                wait = min(wait, max(0.0, remaining - 0.5))
            work = self.front.poll(request.worker_id, request.secret, max_items=request.max, wait_s=wait,
                                   active=context.is_active)
            reply = pb.PollReply(standing=int(work.standing))
            reply.leases.extend(wire.lease_to_proto(lease) for lease in work.leases)
            reply.scores.extend(wire.score_to_proto(t) for t in work.scores)
            if work.train is not None:
                reply.train.CopyFrom(wire.train_to_proto(work.train))
            return reply

        return self._guard(context, poll)

    def Submit(self, request, context):
        def submit():
            done = self.front.submit(request.worker_id, request.secret, wire.events_from_proto(request.events))
            return pb.SubmitReply(standing=int(done.standing),
                                  verdicts=[pb.Verdict(accepted=v.accepted, reason=v.reason or "") for v in done.verdicts])

        return self._guard(context, submit)

    def Heartbeat(self, request, context):
        def beat():
            standing = self.front.heartbeat(request.worker_id, request.secret, rollouts=request.rollouts,
                                            steps=request.steps)
            return pb.HeartbeatReply(standing=int(standing))

        return self._guard(context, beat)

    def Leave(self, request, context):
        def leave():
            self.front.leave(request.worker_id, request.secret, request.reason)
            return pb.LeaveReply()

        return self._guard(context, leave)


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


class _Unreadable:
    """What a request that cannot be parsed, or is over its method's limit, becomes: the handler
    refuses it with ``INVALID_ARGUMENT`` (a deserializer's exception would be ``INTERNAL``,
    which a worker retries)."""

    def __init__(self, reason: str):
        self.reason = reason


def _parser(method: str, message, limit: int):
    def parse(data: bytes):
        if len(data) > limit:
            return _Unreadable(f"a {method} request of {len(data)} bytes; at most {limit} are accepted")
        try:
            return message.FromString(data)
        except Exception as e:  # protobuf's DecodeError, or its recursion limit
            return _Unreadable(f"not a {message.__name__}: {e}")
    return parse


def _checked(behavior, gate: threading.BoundedSemaphore | None = None, room: int = 0):
    def handle(request, context):
        if type(request) is _Unreadable:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
        if gate is None:
            return behavior(request, context)
        if not gate.acquire(blocking=False):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{room} polls are waiting already, as many as this controller serves at once; poll again later")
        try:
            return behavior(request, context)
        finally:
            gate.release()
    return handle


def handlers(service: pb_grpc.ControllerServicer, polls: int) -> grpc.GenericRpcHandler:
    """``service``'s methods, each refusing a request over its ``RECEIVE_BYTES`` before parsing
    it, and ``Poll`` refusing a poll beyond ``polls`` waiting at once (``RESOURCE_EXHAUSTED``)."""
    described = pb.DESCRIPTOR.services_by_name["Controller"]
    gate = threading.BoundedSemaphore(polls)
    methods = {}
    for m in described.methods:
        request, reply = getattr(pb, m.input_type.name), getattr(pb, m.output_type.name)
        behavior = _checked(getattr(service, m.name), *((gate, polls) if m.name == "Poll" else ()))
        methods[m.name] = grpc.unary_unary_rpc_method_handler(
            behavior, request_deserializer=_parser(m.name, request, RECEIVE_BYTES[m.name]),
            response_serializer=reply.SerializeToString)
    return grpc.method_handlers_generic_handler(described.full_name, methods)


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
    """Start serving ``service`` on ``address`` (checked by ``security``: a token off loopback)
    with ``threads`` handler threads, at most ``POLL_SHARE`` of them for long polls."""
    server = grpc.server(
        concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rlx-controller"),
        interceptors=security.interceptors(), options=[*OPTIONS, *PINGS_ACCEPTED, EXCLUSIVE_PORT],
        maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS,
    )
    server.add_generic_rpc_handlers((handlers(service, max(1, int(threads * POLL_SHARE))),))
    port = security.bind(server, address)
    server.start()
    return Served(server, port, service)
