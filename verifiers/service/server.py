"""The verifier gRPC service: one host of a verifier pool (``rlx serve verifier``).

Each RPC checks its request against the host's ceilings (``bounds``), decodes it, calls the
library (``MathVerifier``, ``CodeVerifier``) and encodes the ``Outcome``; nothing is judged here,
so the service and the library cannot disagree, and every request's code (programs and check
scripts alike) runs in the sandbox. A bad request (unknown checker, a limit over this host's
ceiling) is ``INVALID_ARGUMENT`` naming the field. Who may call is ``security``'s business: a
loopback listener by default, a bearer token (and optionally TLS) for any other address.
"""

from __future__ import annotations

import concurrent.futures

import grpc

from verifiers._generated import rlx_verifier_pb2 as pb
from verifiers._generated import rlx_verifier_pb2_grpc as pb_grpc
from verifiers.code.verify import VERSION as CODE_VERSION
from verifiers.code.verify import CodeVerifier
from verifiers.errors import ConfigError, VerifierError
from verifiers.math.judge import version as math_version
from verifiers.math.pool import MathVerifier
from verifiers.service import bounds, convert
from verifiers.service.bounds import ServerConfig
from verifiers.service.security import EXCLUSIVE_PORT, ListenAddress, ServerSecurity

MAX_THREADS = 1024


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
            bounds.check_math_request(request, self.config)
            gold, response, cfg, timeout_s = convert.math_from_proto(request)
            outcome = self.math.verify(gold, response, cfg, timeout_s=timeout_s)
        except VerifierError as e:
            self._abort(context, e)
        return convert.outcome_to_proto(outcome)

    def _code(self, request):
        bounds.check_code_request(request, self.config)
        program, problem = convert.code_from_proto(request)
        bounds.check_limits(problem.limits, self.config)
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
    host: str = "127.0.0.1",
    code: CodeVerifier | None = None,
    math: MathVerifier | None = None,
    threads: int = 16,
    config: ServerConfig = ServerConfig(),
    security: ServerSecurity = ServerSecurity(),
) -> tuple[grpc.Server, int]:
    """Start a verifier server on ``host:port`` (port 0: any free port); returns it and its port.

    A host other than loopback needs ``security.token``; the address and the security settings
    are checked before the sandbox or the math workers start. The caller stops the server with
    ``server.stop(grace)``.
    """
    address = ListenAddress(host, port)
    security.check(address)
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= MAX_THREADS:
        raise ConfigError(f"threads {threads!r} must be an integer from 1 to {MAX_THREADS}")
    service = VerifierService(code or CodeVerifier(), math or MathVerifier(), config)
    message = config.max_message_bytes
    server = grpc.server(
        concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rlx-verifier"),
        interceptors=security.interceptors(),
        maximum_concurrent_rpcs=2 * threads,  # past it RESOURCE_EXHAUSTED: the client tries another host
        options=[("grpc.max_receive_message_length", message), ("grpc.max_send_message_length", message),
                 EXCLUSIVE_PORT],
    )
    pb_grpc.add_VerifierServicer_to_server(service, server)
    try:
        bound = security.bind(server, address)
    except ConfigError:
        server.stop(None)
        raise
    server.start()
    return server, bound
