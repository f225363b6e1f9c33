"""The verifier gRPC service: one host of a verifier pool (``rlx serve verifier``).

Each RPC decodes its request, calls the library (``MathVerifier``, ``CodeVerifier``) and encodes
the ``Outcome``; nothing is judged here, so the service and the library cannot disagree. A bad
request (unknown checker, a limit out of range) is ``INVALID_ARGUMENT`` with the library's
one-line message; the server's own bounds on limits protect the host from greedy clients.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses

import grpc

from verifiers.code.limits import Limits
from verifiers.code.verify import VERSION as CODE_VERSION
from verifiers.code.verify import CodeVerifier
from verifiers.errors import ConfigError, VerifierError
from verifiers.math.judge import version as math_version
from verifiers.math.pool import MathVerifier
from verifiers.service import convert
from verifiers._generated import rlx_verifier_pb2 as pb
from verifiers._generated import rlx_verifier_pb2_grpc as pb_grpc


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """Bounds a host puts on requests: no limit in a request may exceed ``max_limits``."""

    max_limits: Limits = Limits(
        wall_s=120.0, cpu_s=60.0, memory_bytes=4 << 30, output_bytes=64 << 20,
        processes=256, file_bytes=256 << 20, open_files=1024, disk_bytes=1 << 30,
    )
    max_math_timeout_s: float = 60.0
    max_batch: int = 1024


def _bounded(limits: Limits, bound: Limits) -> None:
    for field in dataclasses.fields(Limits):
        value, cap = getattr(limits, field.name), getattr(bound, field.name)
        if value > cap:
            raise ConfigError(f"limit {field.name}={value!r} exceeds this server's maximum {cap!r}")


class VerifierService(pb_grpc.VerifierServicer):
    """The gRPC servicer over a ``CodeVerifier`` and a ``MathVerifier``."""

    def __init__(self, code: CodeVerifier, math: MathVerifier, config: ServerConfig = ServerConfig()):
        self.code = code
        self.math = math
        self.config = config

    def _abort(self, context: grpc.ServicerContext, error: VerifierError):
        code = grpc.StatusCode.INVALID_ARGUMENT if isinstance(error, ConfigError) else grpc.StatusCode.INTERNAL
        context.abort(code, str(error))

    def VerifyMath(self, request, context):
        try:
            gold, response, cfg, timeout_s = convert.math_from_proto(request)
            if timeout_s is not None and timeout_s > self.config.max_math_timeout_s:
                raise ConfigError(
                    f"math timeout_s={timeout_s!r} exceeds this server's maximum {self.config.max_math_timeout_s!r}"
                )
            outcome = self.math.verify(gold, response, cfg, timeout_s=timeout_s)
        except VerifierError as e:
            self._abort(context, e)
        return convert.outcome_to_proto(outcome)

    def _code(self, request):
        program, problem = convert.code_from_proto(request)
        _bounded(problem.limits, self.config.max_limits)
        return program, problem

    def VerifyCode(self, request, context):
        try:
            outcome = self.code.verify(*self._code(request))
        except VerifierError as e:
            self._abort(context, e)
        return convert.outcome_to_proto(outcome)

    def VerifyCodeBatch(self, request, context):
        try:
            if len(request.requests) > self.config.max_batch:
                raise ConfigError(
                    f"batch of {len(request.requests)} exceeds this server's maximum {self.config.max_batch}"
                )
            outcomes = self.code.verify_batch([self._code(r) for r in request.requests])
        except VerifierError as e:
            self._abort(context, e)
        return pb.OutcomeList(outcomes=[convert.outcome_to_proto(o) for o in outcomes])

    def Health(self, request, context):
        return pb.HealthResponse(
            serving=True,
            isolation=self.code.sandbox.level.value,
            math_version=math_version(),
            code_version=CODE_VERSION,
            slots=self.code.sandbox.slots,
        )


def serve(
    port: int,
    *,
    host: str = "[::]",
    code: CodeVerifier | None = None,
    math: MathVerifier | None = None,
    threads: int = 16,
    config: ServerConfig = ServerConfig(),
) -> tuple[grpc.Server, int]:
    """Start a verifier server on ``host:port`` (port 0: any free port); returns it and its port.

    The caller stops it with ``server.stop(grace)``.
    """
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"port {port!r} must be an integer in 0..65535")
    service = VerifierService(code or CodeVerifier(), math or MathVerifier(), config)
    server = grpc.server(
        concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rlx-verifier"),
        options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)],
    )
    pb_grpc.add_VerifierServicer_to_server(service, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise ConfigError(f"cannot listen on {host}:{port}; is the port in use?")
    server.start()
    return server, bound
