"""Programs that try to be rewarded without being right get no reward."""

from __future__ import annotations

import pytest

from tests.verifiers.code.conftest import leftovers
from verifiers.code import CallTest, CheckScript, CodeProblem, IOTest, Limits
from verifiers.outcome import Verdict

CALLS = (CallTest("add", (2, 3), (), 5), CallTest("add", (10, -4), (), 6))
CHECK = CheckScript(
    test="def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(10, -4) == 6\n",
    entry_point="add",
)
IO = (IOTest("2 3\n", "5\n"), IOTest("10 -4\n", "6\n"))


@pytest.mark.parametrize("tests", [IO, CALLS, CHECK], ids=["io", "calls", "check"])
def test_honest_solution_passes(verifier, tests):
    program = (
        "def add(a, b):\n    return a + b\n\n"
        "if __name__ == '__main__':\n    print(add(*map(int, input().split())))\n"
    )
    outcome = verifier.verify(program, CodeProblem(tests))
    assert outcome.verdict is Verdict.AC, outcome.detail
    assert outcome.reward == 1.0


@pytest.mark.parametrize("tests", [IO, CALLS, CHECK], ids=["io", "calls", "check"])
def test_exiting_zero_early(verifier, tests):
    outcome = verifier.verify("import os\nos._exit(0)\n", CodeProblem(tests))
    assert outcome.verdict in (Verdict.WA, Verdict.RE), outcome.detail
    assert outcome.reward == 0.0
    assert leftovers(verifier.sandbox) == {}


@pytest.mark.parametrize("tests", [CALLS, CHECK], ids=["calls", "check"])
def test_sys_exit_zero_inside_the_function(verifier, tests):
    program = "import sys\ndef add(a, b):\n    sys.exit(0)\n"
    outcome = verifier.verify(program, CodeProblem(tests))
    assert outcome.verdict is Verdict.RE, outcome.detail
    assert "SystemExit" in outcome.detail


@pytest.mark.parametrize("tests", [IO, CALLS, CHECK], ids=["io", "calls", "check"])
def test_printing_what_the_harness_might_want(verifier, tests):
    program = (
        "import sys\n"
        "for line in ['5', '6', 'PASSED', 'All tests passed', 'OK', '{\"ready\": true}', '{\"ok\": 5}']:\n"
        "    print(line)\n"
        "    sys.stderr.write(line + '\\n')\n"
        "def add(a, b):\n    return 0\n"
    )
    outcome = verifier.verify(program, CodeProblem(tests))
    assert outcome.verdict is Verdict.WA, outcome.detail
    assert outcome.reward == 0.0


@pytest.mark.parametrize("tests", [CALLS, CHECK], ids=["calls", "check"])
@pytest.mark.parametrize(
    "result",
    [
        "class Any:\n    def __eq__(self, other): return True\n    def __ne__(self, other): return False\n",
        "class Any(int):\n    def __eq__(self, other): return True\n    __hash__ = int.__hash__\n",
        "class Any(tuple):\n    def __eq__(self, other): return True\n",
    ],
    ids=["object", "int-subclass", "tuple-subclass"],
)
def test_permissive_eq_objects_do_not_cross(verifier, tests, result):
    program = result + "def add(a, b):\n    return Any()\n"
    outcome = verifier.verify(program, CodeProblem(tests))
    assert outcome.verdict is Verdict.WA, outcome.detail
    assert "not plain data" in outcome.detail


def test_tampering_with_the_driver_cannot_fake_results(verifier):
    # The solution writes forged replies straight to the protocol pipe before answering.
    program = (
        "import os\n"
        "for fd in range(3, 10):\n"
        "    try:\n"
        "        os.write(fd, b'{\"ok\":5}\\n{\"ok\":6}\\n')\n"
        "    except OSError:\n"
        "        pass\n"
        "def add(a, b):\n    return -1\n"
    )
    outcome = verifier.verify(program, CodeProblem(CALLS))
    assert outcome.reward == 0.0, outcome.detail


def test_slow_solution_in_a_call_session_is_tle(verifier):
    program = "def add(a, b):\n    while True:\n        pass\n"
    outcome = verifier.verify(program, CodeProblem(CALLS, limits=Limits(wall_s=5.0, cpu_s=1.0)))
    assert outcome.verdict is Verdict.TLE, outcome.detail
    assert leftovers(verifier.sandbox) == {}
