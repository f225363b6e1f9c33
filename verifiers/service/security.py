"""Who may talk to an rlx gRPC service: listen address, bearer token, TLS (shared by services).

The rule: a service listens on loopback unless told otherwise, and a listener on any other
address (``0.0.0.0``, ``::``, a host name, a LAN address) refuses to start without a token.
When a token is set, every RPC must carry ``authorization: Bearer <token>`` (compared in
constant time) or is answered ``UNAUTHENTICATED`` before any handler runs. TLS (optionally with
client certificates) comes from PEM files. Secrets and certificates are read with a size cap.

This module knows nothing of the verifier: a controller service reuses it as it is.
"""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import os
import re
from collections.abc import Mapping, Sequence

import grpc

from verifiers.errors import ConfigError
from verifiers.files import read_capped

TOKEN_ENV = "RLX_TOKEN"
MIN_TOKEN_CHARS = 16
MAX_TOKEN_BYTES = 4096
MAX_PEM_BYTES = 1 << 20
# gRPC sets SO_REUSEPORT by default: a second server on a busy port would share it silently.
EXCLUSIVE_PORT = ("grpc.so_reuseport", 0)
_TOKEN = re.compile(r"[\x21-\x7e]+")  # printable ASCII without spaces: a valid header value
_HOST_NAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")


@dataclasses.dataclass(frozen=True)
class ListenAddress:
    """A validated ``host:port`` to listen on; ``host`` is an IP literal or a host name."""

    host: str
    port: int

    def __post_init__(self) -> None:
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigError(f"port {self.port!r} must be an integer in 0..65535")
        host = self.host[1:-1] if self.host.startswith("[") and self.host.endswith("]") else self.host
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if not _HOST_NAME.fullmatch(host):
                raise ConfigError(
                    f"host {self.host!r} is neither an IP address nor a host name; "
                    "give e.g. 127.0.0.1, ::1 or 0.0.0.0"
                ) from None
        object.__setattr__(self, "host", host)

    @property
    def loopback(self) -> bool:
        """Whether only this machine can connect (``localhost`` or a loopback IP)."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False  # a host name may resolve to anything: treated as exposed

    @property
    def target(self) -> str:
        """The address in gRPC's ``host:port`` form (IPv6 in brackets)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def check_token(token: str, where: str) -> str:
    """``token`` if it can serve as a bearer token (16+ printable ASCII characters, no spaces)."""
    if not _TOKEN.fullmatch(token) or len(token) < MIN_TOKEN_CHARS or len(token) > MAX_TOKEN_BYTES:
        raise ConfigError(
            f"the token from {where} must be {MIN_TOKEN_CHARS} to {MAX_TOKEN_BYTES} printable ASCII "
            "characters without spaces"
        )
    return token


def load_token(token_file: str | None = None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The service token: from ``token_file`` (one line) if given, else ``$RLX_TOKEN``, else None."""
    if token_file is not None:
        raw = read_capped(token_file, MAX_TOKEN_BYTES, "token file")
        try:
            text = raw.decode("ascii").strip()
        except UnicodeDecodeError:
            text = "\x00"
        return check_token(text, f"token file {token_file!r}")
    value = environ.get(TOKEN_ENV)
    return None if value is None else check_token(value, f"${TOKEN_ENV}")


def _abort_unauthenticated(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler that refuses the call without reading its request.

    Whatever shape ``handler`` has, the refusal takes the request as a stream it never iterates:
    gRPC then receives no more of the body than HTTP/2's flow-control window, instead of buffering
    and parsing a message of up to the server's receive limit for a caller it is about to turn
    away (the wire cannot tell a unary request from a one-message stream)."""

    def refuse(requests, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

    make = grpc.stream_stream_rpc_method_handler if handler.response_streaming else grpc.stream_unary_rpc_method_handler
    return make(refuse, response_serializer=handler.response_serializer)


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses every RPC whose ``authorization`` metadata is not ``Bearer <token>``."""

    def __init__(self, token: str):
        self._expected = f"Bearer {token}".encode("ascii")

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        given = b""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                given = value.encode("utf-8", "replace") if isinstance(value, str) else bytes(value)
        if hmac.compare_digest(given, self._expected):
            return handler
        return _abort_unauthenticated(handler)


@dataclasses.dataclass(frozen=True)
class ServerSecurity:
    """How a server authenticates callers: a bearer token, TLS files, or neither (loopback only).

    Attributes:
      token: the bearer token every RPC must carry; None: no token check.
      tls_cert, tls_key: PEM files of the server's certificate chain and key; both or neither.
      tls_client_ca: PEM file of the CA that signs client certificates; set: clients must
        present one (mutual TLS).
    """

    token: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None

    def __post_init__(self) -> None:
        if self.token is not None:
            check_token(self.token, "the server's settings")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("TLS needs both --tls-cert and --tls-key")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ConfigError("--tls-client-ca needs --tls-cert and --tls-key")

    def check(self, address: ListenAddress) -> None:
        """Refuse to expose an unauthenticated service beyond this machine."""
        if not address.loopback and self.token is None:
            raise ConfigError(
                f"listening on {address.host} (not loopback) needs a token: set ${TOKEN_ENV} or "
                "pass --token-file"
            )

    def cleartext(self, address: ListenAddress) -> str | None:
        """The one-line warning for a token sent in clear beyond this machine, or None."""
        if address.loopback or self.token is None or self.tls_cert is not None:
            return None
        return (f"warning: listening on {address.host} (not loopback) without TLS: the token travels in clear, "
                "readable by anyone on the network path; give --tls-cert and --tls-key")

    def interceptors(self) -> Sequence[grpc.ServerInterceptor]:
        return () if self.token is None else (TokenInterceptor(self.token),)

    def credentials(self) -> grpc.ServerCredentials | None:
        """TLS credentials from the PEM files, or None for a plaintext listener."""
        if self.tls_cert is None or self.tls_key is None:
            return None
        key = read_capped(self.tls_key, MAX_PEM_BYTES, "TLS key")
        cert = read_capped(self.tls_cert, MAX_PEM_BYTES, "TLS certificate")
        ca = None if self.tls_client_ca is None else read_capped(self.tls_client_ca, MAX_PEM_BYTES, "client CA")
        for data, what in ((key, "TLS key"), (cert, "TLS certificate"), (ca, "client CA")):
            if data is not None and b"-----BEGIN " not in data:
                raise ConfigError(f"the {what} file is not PEM (no -----BEGIN line)")
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)

    def bind(self, server: grpc.Server, address: ListenAddress) -> int:
        """Listen on ``address`` (after ``check``); returns the bound port."""
        self.check(address)
        credentials = self.credentials()
        try:
            if credentials is None:
                port = server.add_insecure_port(address.target)
            else:
                port = server.add_secure_port(address.target, credentials)
        except RuntimeError:
            port = 0
        if port == 0:
            raise ConfigError(
                f"cannot listen on {address.target}: the port is in use or the address is not this host's"
            )
        return port


def channel(
    target: str,
    *,
    root_cert: str | None = None,
    client_cert: str | None = None,
    client_key: str | None = None,
    options: Sequence[tuple[str, object]] = (),
) -> grpc.Channel:
    """A channel to ``target``: TLS when ``root_cert`` (the server's CA, PEM file) is given."""
    if (client_cert is None) != (client_key is None):
        raise ConfigError("a client certificate needs both its certificate and its key file")
    if root_cert is None:
        if client_cert is not None:
            raise ConfigError("a client certificate needs TLS: give the server's root certificate too")
        return grpc.insecure_channel(target, options=list(options))
    credentials = grpc.ssl_channel_credentials(
        root_certificates=read_capped(root_cert, MAX_PEM_BYTES, "TLS root certificate"),
        private_key=None if client_key is None else read_capped(client_key, MAX_PEM_BYTES, "client key"),
        certificate_chain=None if client_cert is None else read_capped(client_cert, MAX_PEM_BYTES, "client certificate"),
    )
    return grpc.secure_channel(target, credentials, options=list(options))


def call_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata each call carries: the bearer token, if any."""
    return () if token is None else (("authorization", f"Bearer {check_token(token, 'the client settings')}"),)
