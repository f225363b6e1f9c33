"""The worker's end of the controller service: calls with a token, deadlines, retries and
fail-over between controller addresses.

A call that cannot reach a controller (``UNAVAILABLE``, a deadline, a fenced controller) raises
:class:`Disconnected`; the worker backs off and tries again, the next address first, and joins
anew when the controller it reaches does not know it. A refused token or a malformed request is
a :class:`UsageError`: retrying cannot help.
"""

from __future__ import annotations

import grpc

from ledger import events as ev
from runtime._generated import rlx_controller_pb2 as pb
from runtime._generated import rlx_controller_pb2_grpc as pb_grpc
from runtime.errors import RlxError, UsageError
from runtime.service import wire
from runtime.service.server import KEEPALIVE_S, OPTIONS
from verifiers.service.security import call_metadata, channel

RETRY = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
                   grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL})
CALL_TIMEOUT_S = 60.0
KEEPALIVE = [  # see server.KEEPALIVE_S
    ("grpc.keepalive_time_ms", int(KEEPALIVE_S * 1000)),
    ("grpc.keepalive_timeout_ms", int(KEEPALIVE_S * 1000)),
    ("grpc.http2.ping_timeout_ms", int(KEEPALIVE_S * 1000)),  # what ends the wait for the answer in gRPC 1.85
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),  # a long poll sends no data: keep pinging all the same
]


class Disconnected(RlxError):
    """No controller answered; try again later (perhaps another address)."""


class AlreadyJoined(RlxError):
    """The worker id is taken; join under another."""


def parse_targets(text: str) -> list[str]:
    """``HOST:PORT[,HOST:PORT…]`` → a list of gRPC targets."""
    targets = [t.strip() for t in text.split(",") if t.strip()]
    for t in targets:
        host, sep, port = t.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"--controller {t!r} is not HOST:PORT (e.g. 127.0.0.1:7000)")
    if not targets:
        raise UsageError("--controller needs at least one HOST:PORT")
    return targets


class ControllerClient:
    """Calls the controller at one of ``targets`` (tried in turn after a failure)."""

    def __init__(self, targets: list[str], *, token: str | None = None, root_cert: str | None = None,
                 client_cert: str | None = None, client_key: str | None = None):
        self.targets = list(targets)
        self.settings = {"token": token, "root_cert": root_cert, "client_cert": client_cert, "client_key": client_key}
        self._metadata = call_metadata(token)
        self._tls = {"root_cert": root_cert, "client_cert": client_cert, "client_key": client_key}
        self._index = 0
        self._channel: grpc.Channel | None = None
        self._stub: pb_grpc.ControllerStub | None = None

    @property
    def target(self) -> str:
        return self.targets[self._index]

    def _connect(self) -> pb_grpc.ControllerStub:
        if self._stub is None:
            self._channel = channel(self.target, options=[*OPTIONS, *KEEPALIVE], **self._tls)
            self._stub = pb_grpc.ControllerStub(self._channel)
        return self._stub

    def fail_over(self) -> None:
        """Drop the connection and move to the next address."""
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None
        self._index = (self._index + 1) % len(self.targets)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None

    def _call(self, name: str, request, timeout: float = CALL_TIMEOUT_S):
        stub = self._connect()
        try:
            return getattr(stub, name)(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            code = e.code()
            if code in RETRY:
                raise Disconnected(f"{name} to {self.target}: {code.name}: {e.details()}") from None
            if code == grpc.StatusCode.ALREADY_EXISTS:
                raise AlreadyJoined(e.details()) from None
            raise UsageError(f"the controller at {self.target} refused {name}: {code.name}: {e.details()}") from None

    # -- the calls ------------------------------------------------------------------------------

    def describe(self) -> pb.RunInfo:
        return self._call("Describe", pb.DescribeRequest(), timeout=10.0)

    def join(self, worker_id: str, role: str, *, slots: int = 1, info: dict | None = None) -> pb.JoinReply:
        return self._call("Join", pb.JoinRequest(worker_id=worker_id, role=role, slots=slots,
                                                 info=wire.pack_map(dict(info or {}))), timeout=30.0)

    def poll(self, worker_id: str, *, max_items: int = 512, wait_s: float = 5.0) -> pb.PollReply:
        return self._call("Poll", pb.PollRequest(worker_id=worker_id, max=max_items, wait_s=wait_s),
                          timeout=wait_s + 30.0)

    def submit(self, worker_id: str, events: list[ev.Event]) -> pb.SubmitReply:
        return self._call("Submit", pb.SubmitRequest(worker_id=worker_id,
                                                     events=[wire.event_to_proto(e) for e in events]))

    def heartbeat(self, worker_id: str, *, rollouts=(), steps=()) -> pb.HeartbeatReply:
        return self._call("Heartbeat", pb.HeartbeatRequest(worker_id=worker_id, rollouts=list(rollouts),
                                                           steps=list(steps)), timeout=10.0)

    def leave(self, worker_id: str, reason: str) -> None:
        self._call("Leave", pb.LeaveRequest(worker_id=worker_id, reason=reason), timeout=10.0)
