"""The verifier gRPC service and its client (imports grpc; the library itself does not).

Names are loaded on first use, so that ``verifiers.service.bounds`` (pure ceilings, used by the
``rlx verify`` command line) and ``verifiers.service.security`` load without the server.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ServerConfig": "verifiers.service.bounds",
    "ServerSecurity": "verifiers.service.security",
    "ListenAddress": "verifiers.service.security",
    "VerifierClient": "verifiers.service.client",
    "VerifierService": "verifiers.service.server",
    "serve": "verifiers.service.server",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
