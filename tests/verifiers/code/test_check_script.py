"""Check scripts run in a sandboxed process of their own, and a check that proves nothing fails."""

from __future__ import annotations

import concurrent.futures

import pytest

from tests.verifiers.code.conftest import _UID_BASE, leftovers
from verifiers.code import CheckScript, CodeProblem, CodeVerifier, Limits, Sandbox
from verifiers.errors import ConfigError
from verifiers.outcome import Verdict

ADD = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return 0\n"
LIMITS = Limits(wall_s=10.0, cpu_s=5.0)


def _check(test: str, setup: str = "") -> CodeProblem:
    return CodeProblem(CheckScript(test=test, entry_point="add", setup=setup), limits=LIMITS)


def test_check_code_does_not_run_in_the_verifier(verifier, tmp_path):
    marker = tmp_path / "written-by-the-check"
    test = (
        "import os\n"
        "def check(candidate):\n"
        f"    try:\n        open({str(marker)!r}, 'w').write('x')\n    except OSError:\n        pass\n"
        "    assert candidate(2, 3) == 5\n"
        "    assert os.getuid() != 0, 'the check runs as root'\n"
        f"    assert os.getpid() != {__import__('os').getpid()}, 'the check runs in the verifier'\n"
    )
    outcome = verifier.verify(ADD, _check(test))
    assert outcome.verdict is Verdict.AC, outcome.detail
    assert not marker.exists()
    assert leftovers(verifier.sandbox) == {}


@pytest.mark.parametrize(
    "test, detail",
    [
        ("def check(candidate):\n    pass\n", "the check script never called add"),
        ("def check(candidate):\n    candidate(2, 3)\n", "the check script ran no assert statement"),
        ("def check(candidate):\n    assert True\n", "the check script never called add"),
    ],
    ids=["empty", "calls-without-assert", "asserts-without-call"],
)
def test_a_check_that_proves_nothing_passes_nothing(verifier, test, detail):
    outcome = verifier.verify(WRONG, _check(test))
    assert (outcome.verdict, outcome.detail) == (Verdict.INTERNAL_ERROR, f"test 0: {detail}")
    assert outcome.reward == 0.0


def test_the_check_keeps_its_semantics(verifier):
    """Failures of the solution reach the check as exceptions it may expect, as before."""
    raising = "def add(a, b):\n    raise ValueError('no')\n"
    expects = "def check(candidate):\n    try:\n        candidate(1, 2)\n    except Exception:\n        pass\n" \
              "    else:\n        assert False, 'should raise'\n    assert True\n"
    assert verifier.verify(raising, _check(expects)).verdict is Verdict.AC
    plain = "def check(candidate):\n    assert candidate(1, 2) == 3\n"
    assert verifier.verify(raising, _check(plain)).detail == "test 0: add raised ValueError: no"
    assert verifier.verify(WRONG, _check(plain)).detail == "test 0: check failed at call 1"
    drawn = "import random\ndef check(candidate):\n    x = random.randint(0, 10**9)\n" \
            "    assert candidate(x, 0) == 0, x\n"
    details = {verifier.verify(ADD, _check(drawn)).detail for _ in range(2)}
    assert len(details) == 1 and "check failed at call 1: " in details.pop()  # same draw each time


def test_the_solution_cannot_reach_the_check(verifier):
    """The solution looks for the check's process and files; it finds nothing it may touch."""
    program = (
        "import os, signal\n"
        "def add(a, b):\n"
        "    for pid in os.listdir('/proc'):\n"
        "        if pid.isdigit() and int(pid) != os.getpid():\n"
        "            try:\n                os.kill(int(pid), signal.SIGKILL)\n"
        "            except OSError:\n                pass\n"
        "    return 0\n"
    )
    outcome = verifier.verify(program, _check("def check(candidate):\n    assert candidate(2, 3) == 5\n"))
    assert (outcome.verdict, outcome.detail) == (Verdict.WA, "test 0: check failed at call 1")


def test_a_broken_or_endless_check_is_bounded(verifier):
    outcome = verifier.verify(ADD, _check("def check(candidate:\n"))
    assert outcome.verdict is Verdict.INTERNAL_ERROR and "failed to load: SyntaxError" in outcome.detail
    fast = CodeProblem(CheckScript("def check(candidate):\n    assert candidate(1, 1) == 2\n    while True: pass\n",
                                   "add"), limits=Limits(wall_s=1.0, cpu_s=1.0))
    outcome = verifier.verify(ADD, fast)
    assert outcome.verdict is Verdict.TLE and outcome.detail.startswith("test 0: the check script: ")


def test_many_checks_on_two_slots_do_not_deadlock(verifier):
    problem = _check("def check(candidate):\n    assert candidate(2, 3) == 5\n")
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        outcomes = list(pool.map(lambda _: verifier.verify(ADD, problem), range(12), timeout=120))
    assert [o.verdict for o in outcomes] == [Verdict.AC] * 12


def test_one_slot_is_a_config_error():
    with Sandbox("auto", slots=1, uid_base=_UID_BASE + 90) as sandbox:
        with pytest.raises(ConfigError, match="a check script needs a sandbox with at least 2 slots"):
            CodeVerifier(sandbox).verify(ADD, _check("def check(candidate):\n    assert candidate(2, 3) == 5\n"))
