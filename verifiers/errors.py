"""Errors of the verifiers package.

``VerifierError`` is the base of every verifier failure that is not a verdict about the answer:
a bad limit, an unreadable tests file, a sandbox that cannot start. A wrong answer or a crashing
program is never an exception; it is an ``Outcome`` with a verdict.
"""

from __future__ import annotations


class VerifierError(Exception):
    """Base class of verifier errors; the CLI prints these as one line."""


class ConfigError(VerifierError):
    """A user's mistake in a limit, a language name or a tests file; names the bad value."""


class SandboxUnavailable(VerifierError):
    """No isolation level that was asked for can run on this machine."""


class ServiceError(VerifierError):
    """A verifier service could not be reached or answered with an error (retryable)."""
