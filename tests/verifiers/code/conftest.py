"""Sandboxes shared by the code verifier tests, one per isolation level."""

from __future__ import annotations

import os

import pytest

from verifiers.code import CodeVerifier, Sandbox, processes
from verifiers.errors import SandboxUnavailable

# Each xdist worker starts its search for free uids elsewhere (the flock would sort it out anyway).
_UID_BASE = 62_000 + 100 * int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)


def _sandbox(level: str) -> Sandbox:
    try:
        return Sandbox(level, slots=2, uid_base=_UID_BASE)
    except SandboxUnavailable as e:
        pytest.skip(f"isolation {level!r} unavailable here: {e}")


@pytest.fixture(scope="session")
def namespaces_sandbox():
    with _sandbox("namespaces") as sandbox:
        yield sandbox


@pytest.fixture(scope="session")
def rlimits_sandbox():
    with _sandbox("rlimits") as sandbox:
        yield sandbox


@pytest.fixture(params=["namespaces", "rlimits"])
def sandbox(request):
    return request.getfixturevalue(f"{request.param}_sandbox")


@pytest.fixture
def verifier(sandbox):
    return CodeVerifier(sandbox)


def leftovers(sandbox: Sandbox) -> dict[int, list[int]]:
    """Processes still owned by any of the sandbox's uids (must be none between runs)."""
    return {uid: pids for uid in sandbox.uids if (pids := processes.processes_of(uid))}
