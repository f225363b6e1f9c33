"""The verifier gRPC service and its client (imports grpc; the library itself does not)."""

from verifiers.service.client import VerifierClient
from verifiers.service.server import ServerConfig, VerifierService, serve

__all__ = ["ServerConfig", "VerifierClient", "VerifierService", "serve"]
