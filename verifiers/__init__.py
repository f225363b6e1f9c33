"""Verifiers: typed outcomes, math answers and sandboxed code execution.

Public names are re-exported here and imported on first use, so that importing
``verifiers.errors`` (as the CLI does) does not pull in sympy or the sandbox.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Outcome": "verifiers.outcome",
    "TestResult": "verifiers.outcome",
    "Timings": "verifiers.outcome",
    "Verdict": "verifiers.outcome",
    "VerifierError": "verifiers.errors",
    "ConfigError": "verifiers.errors",
    "SandboxUnavailable": "verifiers.errors",
    "ServiceError": "verifiers.errors",
    "MathConfig": "verifiers.math",
    "MathVerifier": "verifiers.math",
    "judge_math": "verifiers.math",
    "verify_math": "verifiers.math",
    "CallTest": "verifiers.code",
    "CheckScript": "verifiers.code",
    "CodeProblem": "verifiers.code",
    "CodeVerifier": "verifiers.code",
    "IOTest": "verifiers.code",
    "Isolation": "verifiers.code",
    "Limits": "verifiers.code",
    "Sandbox": "verifiers.code",
    "verify_code": "verifiers.code",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from verifiers.code import (
        CallTest,
        CheckScript,
        CodeProblem,
        CodeVerifier,
        IOTest,
        Isolation,
        Limits,
        Sandbox,
        verify_code,
    )
    from verifiers.errors import ConfigError, SandboxUnavailable, ServiceError, VerifierError
    from verifiers.math import MathConfig, MathVerifier, judge_math, verify_math
    from verifiers.outcome import Outcome, TestResult, Timings, Verdict


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'verifiers' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
