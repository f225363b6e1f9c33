"""The code verifier end to end: IO tests, call tests, early stop, compiled languages, batches."""

from __future__ import annotations

import pytest

from tests.verifiers.code.conftest import leftovers
from verifiers.code import CallTest, CodeProblem, CodeVerifier, IOTest, Limits
from verifiers.code.languages import LANGUAGES
from verifiers.outcome import Verdict

SUM = (IOTest("1 2\n", "3\n"), IOTest("5 7\n", "12\n"), IOTest("-1 1\n", "0\n"))


def test_io_tests_pass_and_report_each(verifier):
    outcome = verifier.verify("a, b = map(int, input().split())\nprint(a + b)\n", CodeProblem(SUM))
    assert outcome.verdict is Verdict.AC and outcome.detail == "all 3 tests passed"
    assert [t.verdict for t in outcome.tests] == [Verdict.AC] * 3
    assert outcome.isolation == verifier.sandbox.level.value


def test_early_stop_and_all_tests(verifier):
    wrong = "a, b = map(int, input().split())\nprint(a + b if a > 0 else 99)\n"
    stopped = verifier.verify(wrong, CodeProblem(SUM[::-1]))
    assert [t.verdict for t in stopped.tests] == [Verdict.WA]
    assert stopped.detail == "test 0: token 0: got '99', expected '0'"
    full = verifier.verify(wrong, CodeProblem(SUM, stop_early=False))
    assert [t.verdict for t in full.tests] == [Verdict.AC, Verdict.AC, Verdict.WA]
    assert full.verdict is Verdict.WA and full.detail.startswith("test 2:")


def test_checkers_apply(verifier):
    program = "print('3.14159  ')\n"
    assert verifier.verify(program, CodeProblem((IOTest("", "3.14159"),), checker="exact")).verdict is Verdict.WA
    assert verifier.verify(program, CodeProblem((IOTest("", "3.14159"),), checker="tokens")).verdict is Verdict.AC
    assert verifier.verify(program, CodeProblem((IOTest("", "3.141592"),), checker="float")).verdict is Verdict.AC


def test_large_input_and_output(verifier):
    numbers = " ".join(str(i) for i in range(200_000))
    problem = CodeProblem((IOTest(numbers + "\n", str(sum(range(200_000)))),))
    outcome = verifier.verify("print(sum(map(int, input().split())))\n", problem)
    assert outcome.verdict is Verdict.AC, outcome.detail


def test_call_tests(verifier):
    tests = (
        CallTest("f", (3,), (("scale", 2.5),), [7.5, (3, "x")]),
        CallTest("f", (0,), (), [0.0, (0, "x")]),
    )
    good = "def f(n, scale=1.0):\n    return [n * scale, (n, 'x')]\n"
    assert verifier.verify(good, CodeProblem(tests)).verdict is Verdict.AC
    wrong_type = "def f(n, scale=1.0):\n    return [n * scale, [n, 'x']]\n"  # list, not tuple
    outcome = verifier.verify(wrong_type, CodeProblem(tests))
    assert outcome.verdict is Verdict.WA and "f returned [7.5, [3, 'x']]" in outcome.detail
    missing = "def g():\n    pass\n"
    assert "no function 'f'" in verifier.verify(missing, CodeProblem(tests)).detail


def test_syntax_error_is_ce_for_calls(verifier):
    outcome = verifier.verify("def f(:\n", CodeProblem((CallTest("f", (), (), 1),)))
    assert outcome.verdict is Verdict.CE and "SyntaxError" in outcome.detail


@pytest.mark.skipif(not LANGUAGES["c"].available(), reason="gcc is not installed")
def test_c_is_compiled_in_the_sandbox(namespaces_sandbox):
    verifier = CodeVerifier(namespaces_sandbox)
    program = '#include <stdio.h>\nint main(void){long a,b;scanf("%ld %ld",&a,&b);printf("%ld\\n",a+b);return 0;}\n'
    outcome = verifier.verify(program, CodeProblem(SUM, language="c", limits=Limits(wall_s=20, cpu_s=10)))
    assert outcome.verdict is Verdict.AC, outcome.detail
    broken = verifier.verify("int main( {", CodeProblem(SUM, language="c", limits=Limits(wall_s=20, cpu_s=10)))
    assert broken.verdict is Verdict.CE and "compile failed" in broken.detail
    # the compiler cannot read host files either
    leak = verifier.verify('#include "/etc/shadow"\nint main(void){return 0;}\n',
                           CodeProblem(SUM, language="c", limits=Limits(wall_s=20, cpu_s=10)))
    assert leak.verdict is Verdict.CE and "No such file" in leak.detail
    assert leftovers(namespaces_sandbox) == {}


def test_batch_matches_one_by_one(verifier):
    programs = [
        "a, b = map(int, input().split())\nprint(a + b)\n",
        "print(0)\n",
        "import time\ntime.sleep(30)\n",
        "raise SystemExit(3)\n",
    ] * 2
    problem = CodeProblem(SUM, limits=Limits(wall_s=1.0))
    batch = verifier.verify_batch([(p, problem) for p in programs])
    assert [o.verdict for o in batch] == [Verdict.AC, Verdict.WA, Verdict.TLE, Verdict.RE] * 2
    assert batch[:4] == [verifier.verify(p, problem) for p in programs[:4]]
    assert leftovers(verifier.sandbox) == {}
