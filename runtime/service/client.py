"""The worker's end of the controller service: the run's ``ControllerPort`` over gRPC, with a
token, deadlines, retries and fail-over between controller addresses.

A call that cannot reach a controller (``UNAVAILABLE``, a deadline, a fenced controller) raises
:class:`Disconnected`; the worker backs off and tries again, the next address first, and joins
anew when the controller it reaches does not know it; a controller at one of its ceilings
(``RESOURCE_EXHAUSTED``) raises :class:`Busy`, retried the same way. A refused token, a call
without its worker's secret or a malformed request is a :class:`UsageError`: retrying cannot help.

The client keeps the secret each of its joins answered and sends it with every later call under
that worker id (``twin`` shares them with another connection, e.g. for heartbeats).
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from ledger import events as ev
from runtime._generated import rlx_controller_pb2 as pb
from runtime._generated import rlx_controller_pb2_grpc as pb_grpc
from runtime.controller.workers import Verdict
from runtime.errors import UsageError
from runtime.host.port import AlreadyJoined, Busy, Disconnected, Joined, RunInfo, Standing, Submitted, Work
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
        self.secrets: dict[str, str] = {}  # worker id -> the secret its join answered
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

    def twin(self) -> ControllerClient:
        """Another connection to the same controllers, with the same token, TLS and secrets."""
        other = ControllerClient(self.targets, **self.settings)
        other.secrets = self.secrets
        return other

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
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise Busy(f"{name} to {self.target}: {e.details()}") from None
            if code in RETRY:
                raise Disconnected(f"{name} to {self.target}: {code.name}: {e.details()}") from None
            if code == grpc.StatusCode.ALREADY_EXISTS:
                raise AlreadyJoined(e.details()) from None
            raise UsageError(f"the controller at {self.target} refused {name}: {code.name}: {e.details()}") from None

    # -- the port -------------------------------------------------------------------------------

    def describe(self) -> RunInfo:
        m = self._call("Describe", pb.DescribeRequest(), timeout=10.0)
        return RunInfo(Standing(m.standing), m.run_id, wire.unpack_map(m.config, "run config"), m.params_url,
                       m.epoch, m.heartbeat_s)

    def join(self, worker_id: str, role: str, *, slots: int = 1, info: dict | None = None) -> Joined:
        m = self._call("Join", pb.JoinRequest(worker_id=worker_id, role=role, slots=slots,
                                              info=wire.pack_map(dict(info or {}))), timeout=30.0)
        if m.secret:
            self.secrets[m.worker_id] = m.secret
        return Joined(Standing(m.standing), m.worker_id, m.epoch, m.secret)

    def poll(self, worker_id: str, *, max_items: int = 512, wait_s: float = 5.0) -> Work:
        m = self._call("Poll", pb.PollRequest(worker_id=worker_id, secret=self.secrets.get(worker_id, ""),
                                              max=max_items, wait_s=wait_s), timeout=wait_s + 30.0)
        return Work(Standing(m.standing), tuple(wire.lease_from_proto(x) for x in m.leases),
                    tuple(wire.score_from_proto(x) for x in m.scores),
                    wire.train_from_proto(m.train) if m.HasField("train") else None)

    def submit(self, worker_id: str, events: Sequence[ev.Event]) -> Submitted:
        m = self._call("Submit", pb.SubmitRequest(worker_id=worker_id, secret=self.secrets.get(worker_id, ""),
                                                  events=[wire.event_to_proto(e) for e in events]))
        return Submitted(Standing(m.standing), tuple(Verdict(v.accepted, v.reason or None) for v in m.verdicts))

    def heartbeat(self, worker_id: str, *, rollouts=(), steps=()) -> Standing:
        m = self._call("Heartbeat", pb.HeartbeatRequest(worker_id=worker_id, secret=self.secrets.get(worker_id, ""),
                                                        rollouts=list(rollouts), steps=list(steps)), timeout=10.0)
        return Standing(m.standing)

    def leave(self, worker_id: str, reason: str) -> None:
        self._call("Leave", pb.LeaveRequest(worker_id=worker_id, secret=self.secrets.get(worker_id, ""),
                                            reason=reason), timeout=10.0)
