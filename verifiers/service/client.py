"""A client for a pool of verifier hosts: same calls and same ``Outcome``s as the library.

Requests go round-robin over the targets; a host that is unavailable is skipped and the request
goes to the next one (verification is idempotent, so a retry cannot double-count). A request the
server rejects as invalid raises ``ConfigError`` with the server's message. A host that refuses
the caller (``UNAUTHENTICATED``, ``PERMISSION_DENIED``) is a ``ServiceError``, never retried.
"""

from __future__ import annotations

import itertools
import math as _math
import threading
from collections.abc import Sequence

import grpc

from verifiers._generated import rlx_verifier_pb2 as pb
from verifiers._generated import rlx_verifier_pb2_grpc as pb_grpc
from verifiers.code.problems import CodeProblem
from verifiers.errors import ConfigError, ServiceError
from verifiers.math.judge import MathConfig
from verifiers.outcome import Outcome
from verifiers.service import convert, security

_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED}


class VerifierClient:
    """Calls verifier hosts ``targets`` (``"host:port"`` each).

    Args:
      targets: one or more hosts of a verifier pool.
      timeout_s: deadline of one RPC; it should exceed the longest limits requested.
      token: the pool's bearer token (sent on every call); None: none.
      tls_root_cert: PEM file of the CA that signed the hosts' certificates; set: TLS.
      tls_client_cert, tls_client_key: PEM files of this client's certificate (mutual TLS).
    """

    def __init__(
        self,
        targets: Sequence[str] | str,
        *,
        timeout_s: float = 300.0,
        token: str | None = None,
        tls_root_cert: str | None = None,
        tls_client_cert: str | None = None,
        tls_client_key: str | None = None,
    ):
        targets = [targets] if isinstance(targets, str) else list(targets)
        if not targets:
            raise ConfigError("a verifier client needs at least one target host:port")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
                or not _math.isfinite(timeout_s) or timeout_s <= 0:
            raise ConfigError(f"client timeout_s {timeout_s!r} must be a finite number of seconds > 0")
        self._metadata = security.call_metadata(token)
        options = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
        self._channels = [
            security.channel(t, root_cert=tls_root_cert, client_cert=tls_client_cert,
                             client_key=tls_client_key, options=options)
            for t in targets
        ]
        self._stubs = [pb_grpc.VerifierStub(c) for c in self._channels]
        self.targets = tuple(targets)
        self.timeout_s = float(timeout_s)
        self._next = itertools.cycle(range(len(targets)))
        self._lock = threading.Lock()

    def _call(self, method: str, request):
        with self._lock:
            start = next(self._next)
        errors = []
        for k in range(len(self._stubs)):
            i = (start + k) % len(self._stubs)
            try:
                return getattr(self._stubs[i], method)(request, timeout=self.timeout_s, metadata=self._metadata)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    raise ConfigError(e.details()) from None
                if e.code() not in _RETRYABLE:
                    raise ServiceError(f"{self.targets[i]}: {e.code().name}: {e.details()}") from None
                errors.append(f"{self.targets[i]}: {e.code().name}")
        raise ServiceError("no verifier host answered: " + "; ".join(errors))

    def verify_math(
        self, gold: str, response: str, config: MathConfig = MathConfig(), timeout_s: float | None = None
    ) -> Outcome:
        reply = self._call("VerifyMath", convert.math_to_proto(gold, response, config, timeout_s))
        return convert.outcome_from_proto(reply)

    def verify_code(self, program: str, problem: CodeProblem) -> Outcome:
        return convert.outcome_from_proto(self._call("VerifyCode", convert.code_to_proto(program, problem)))

    def verify_code_batch(self, items: Sequence[tuple[str, CodeProblem]]) -> list[Outcome]:
        request = pb.CodeBatchRequest(requests=[convert.code_to_proto(p, q) for p, q in items])
        return [convert.outcome_from_proto(o) for o in self._call("VerifyCodeBatch", request).outcomes]

    def health(self) -> list[pb.HealthResponse | None]:
        """Each target's health, in order; None for a host that does not answer."""
        answers = []
        for stub in self._stubs:
            try:
                answers.append(stub.Health(pb.HealthRequest(), timeout=min(self.timeout_s, 10.0),
                                           metadata=self._metadata))
            except grpc.RpcError:
                answers.append(None)
        return answers

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def __enter__(self) -> VerifierClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
