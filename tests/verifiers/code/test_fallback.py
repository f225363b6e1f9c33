"""Falling back to the weak ``rlimits`` level is loud and can be refused (finding: ``auto`` fell
back silently, and the program then read the repository and /etc/passwd).

Namespaces are made unavailable for real: with ``RLX_SANDBOX_NO_NAMESPACES=1`` the probe runs
bubblewrap under a seccomp filter that denies creating namespaces, so the probe itself fails.
"""

from __future__ import annotations

import logging

import pytest

from tests.verifiers.code.conftest import _UID_BASE
from verifiers.code import Sandbox
from verifiers.code import sandbox as sandbox_module
from verifiers.code.languages import LANGUAGES
from verifiers.code.sandbox import WeakIsolationRefused
from verifiers.errors import SandboxUnavailable, VerifierError


@pytest.fixture
def no_namespaces(monkeypatch):
    monkeypatch.setenv(sandbox_module.NO_NAMESPACES_ENV, "1")
    yield
    monkeypatch.delenv(sandbox_module.NO_NAMESPACES_ENV)


def test_namespaces_work_here_without_the_switch(caplog):
    with caplog.at_level(logging.INFO, logger="verifiers.code.sandbox"):
        with Sandbox("auto", slots=1, uid_base=_UID_BASE + 40) as sandbox:
            assert sandbox.level.value == "namespaces"
            assert sandbox.fallback is None
    # the one line said at start: the level and how each limit is enforced
    assert [r.getMessage() for r in caplog.records] == [sandbox.describe()]


def test_auto_refuses_the_weak_level_unless_allowed(no_namespaces):
    with pytest.raises(WeakIsolationRefused) as raised:
        Sandbox("auto", slots=1, uid_base=_UID_BASE + 40)
    assert isinstance(raised.value, SandboxUnavailable) and isinstance(raised.value, VerifierError)
    message = str(raised.value)
    assert "\n" not in message and "rlimits" in message and "allow_weak" in message


def test_auto_falls_back_loudly_when_allowed(no_namespaces):
    with pytest.warns(RuntimeWarning, match="rlimits"):
        sandbox = Sandbox("auto", slots=1, uid_base=_UID_BASE + 40, allow_weak=True)
    with sandbox:
        assert sandbox.level.value == "rlimits"
        assert sandbox.fallback  # why namespaces were not available
        assert "namespace" in sandbox.fallback.lower() or "operation not permitted" in sandbox.fallback.lower()
        assert "fallback" in sandbox.describe()
        # the weak level really runs: the host's /etc/passwd is visible to the program
        program = b"print(open('/etc/passwd').read().split(':')[0])\n"
        result = sandbox.run(LANGUAGES["python"].run, files={"main.py": program})
        assert result.stdout == b"root\n"


def test_namespaces_by_name_fail_clearly_when_unavailable(no_namespaces):
    with pytest.raises(SandboxUnavailable, match="namespaces"):
        Sandbox("namespaces", slots=1, uid_base=_UID_BASE + 40)


def test_rlimits_by_name_is_not_a_fallback(no_namespaces, recwarn):
    with Sandbox("rlimits", slots=1, uid_base=_UID_BASE + 40) as sandbox:
        assert sandbox.level.value == "rlimits" and sandbox.fallback is None
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
