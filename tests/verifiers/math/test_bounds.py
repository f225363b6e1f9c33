"""Denial of service: tiny hostile inputs get a verdict at once instead of burning the timeout.

The main assertion is each verdict (a wrong answer or a typed "too large" failure); the time
bound is a loose guard (the old code took the whole 10 s timeout, or minutes, on each).
"""

import fractions
import time

import pytest

from verifiers.errors import ConfigError
from verifiers.math import MathVerifier, judge_math
from verifiers.math.exact import TooLarge, evaluate
from verifiers.math.guard import check_size
from verifiers.math.judge import MathConfig, judge_bounded
from verifiers.outcome import Verdict

TOO_LARGE = "too large to judge"

HOSTILE = [
    # (gold, response, verdict, words in the detail)
    ("1", r"\boxed{(10^{10000})^{10000}}", Verdict.PARSE_ERROR, "a power needs more than"),
    ("1", r"\boxed{((10!)!)!}", Verdict.PARSE_ERROR, "a factorial beyond"),
    ("7", r"\boxed{99999999!}", Verdict.PARSE_ERROR, "a factorial beyond"),
    ("1", r"\boxed{9^{9^{9}}}", Verdict.PARSE_ERROR, "an exponent beyond"),
    ("1", r"\boxed{2^{2^{2^{2^{2^{2}}}}}}", Verdict.PARSE_ERROR, TOO_LARGE),
    ("1", r"\boxed{\sqrt[3]{5000!+1}}", Verdict.PARSE_ERROR, "root of a number beyond"),
    ("1", r"\boxed{\{9^{9^{9}}\}}", Verdict.PARSE_ERROR, "could hold a number beyond"),
    ("x", r"\boxed{\prod_{k=1}^{10^{7}} k}", Verdict.PARSE_ERROR, "could hold a number beyond"),
    ("x", r"\boxed{x^{10^{100}}}", Verdict.PARSE_ERROR, "could hold a number beyond"),
    ("x", r"\boxed{(x+1)^{10000}}", Verdict.PARSE_ERROR, "polynomials beyond degree"),
    ("x", r"\boxed{(x+1)^{100}(x+2)^{100}(x+3)^{100}}", Verdict.PARSE_ERROR, "polynomials beyond degree"),
    ("x", r"\boxed{(x+y+z+1)^{40}}", Verdict.PARSE_ERROR, "could expand to more than"),
    ("1", r"\boxed{" * 5_000, Verdict.PARSE_ERROR, "no final answer"),
    ("7", r"\boxed{" * 10_000 + " so 7", Verdict.AC, "identical"),  # unclosed boxes are no answer
    ("1", "(" * 3_000 + "2" + ")" * 3_000, Verdict.WA, "not equal"),
    ("x", r"\boxed{" + "(" * 500 + "x" + ")" * 500 + "}", Verdict.PARSE_ERROR, "nests deeper"),
    ("1", r"\boxed{" + "1+" * 1_500 + "1}", Verdict.PARSE_ERROR, "longer than 2000"),
    ("1", "1" * 200_000, Verdict.PARSE_ERROR, "longer than 100000"),
]


# Refused before the work: milliseconds alone, a second or two on a loaded machine. The work itself
# would take minutes to hours and the pool's timeout is 20 s, so this ceiling tells them apart.
AT_ONCE_S = 10.0


@pytest.mark.parametrize("gold, response, verdict, words", HOSTILE, ids=lambda v: str(v)[:30])
def test_hostile_answers_are_judged_at_once(gold, response, verdict, words):
    start = time.monotonic()
    outcome = judge_math(gold, response)
    assert outcome.verdict is verdict, outcome.detail
    assert words in outcome.detail
    assert outcome.reward == (1.0 if verdict is Verdict.AC else 0.0)
    assert time.monotonic() - start < AT_ONCE_S


def test_a_hostile_reference_is_an_internal_error():
    outcome = judge_math(r"(10^{10000})^{10000}", "1")
    assert outcome.verdict is Verdict.INTERNAL_ERROR and "cannot be judged" in outcome.detail


def test_through_the_pool_hostile_answers_are_not_timeouts():
    """The time-bounded path answers at once too: no worker sits out its timeout."""
    with MathVerifier(workers=1, timeout_s=20.0) as verifier:
        assert verifier.verify("x+1", r"\boxed{1+x}").verdict is Verdict.AC  # starts the worker
        for gold, response, verdict, _ in HOSTILE[:12]:
            start = time.monotonic()
            outcome = verifier.verify(gold, response)
            assert outcome.verdict is verdict, outcome.detail
            assert time.monotonic() - start < AT_ONCE_S


def test_runtime_scoring_is_bounded_in_process():
    """``rlx run`` scores arithmetic in process: hostile completions cost nothing there."""
    from runtime.tasks.arithmetic import Arithmetic
    from verifiers.math import verify_math

    assert verify_math("x+1", r"\boxed{1+x}").verdict is Verdict.AC  # starts the shared worker
    task = Arithmetic(digits=3)
    problem = task.problem("train", 0)
    completions = [r[1] for r in HOSTILE if r[0] in ("1", "7")] + [problem.answer]
    start = time.monotonic()
    scores = task.score([problem] * len(completions), completions)
    assert [s.reward for s in scores] == [0.0] * (len(completions) - 1) + [1.0]
    assert time.monotonic() - start < AT_ONCE_S


@pytest.mark.parametrize(
    "text", [r"(10^{10000})^{10000}", "((10!)!)!", r"\sqrt{5000!}", "1e10001", "(" * 41 + "1" + ")" * 41]
)
def test_exact_refuses_before_computing(text):
    with pytest.raises(TooLarge):
        evaluate(text)


@pytest.mark.parametrize("text", ["5000!", r"\sqrt{(5000!)^2}", "1e10000", r"(1+\sqrt{2})^{10000}", r"2^{10000}"])
def test_exact_still_computes_within_the_bounds(text):
    assert evaluate(text) is not None


@pytest.mark.parametrize(
    "text", [r"x^{2023}", r"(x+1)^{10}", r"\binom{10^{6}}{5}", r"\sum_{k=1}^{n} k^2", r"e^{x^2}", r"2^{1/2}"]
)
def test_guard_lets_ordinary_formulas_through(text):
    check_size(text)


@pytest.mark.parametrize("value", ["1e6000000", "1e-6000000", "1" * 1_000_000, 10**100_000, 1e-320,
                                   float("nan"), float("inf"), True, fractions.Fraction(1, 10**1000), "abc"],
                         ids=lambda v: type(v).__name__ + ":" + repr(v)[:12] if not isinstance(v, int) else "int")
def test_tolerance_has_a_bounded_grammar_and_range(value):
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"(is not a number|is out of range); give 0 or a number in"):
        MathConfig(rel_tol=value)
    assert time.monotonic() - start < 0.1


@pytest.mark.parametrize("value, exact", [("1e-6", fractions.Fraction(1, 10**6)), ("1/1000", fractions.Fraction(1, 1000)),
                                          (0.5, fractions.Fraction(1, 2)), (0, 0), ("2.5E+2", 250)])
def test_tolerance_accepts_ordinary_values(value, exact):
    config = MathConfig(rel_tol=value, abs_tol=value)
    assert config.rel_tol == exact and config.abs_tol == exact
    assert MathConfig(rel_tol=str(config.rel_tol)).rel_tol == exact  # the worker's round trip


def test_bounded_judging_defers_only_what_needs_symbolic_work():
    assert judge_bounded("122", "122") == judge_math("122", "122")
    assert judge_bounded("122", "x+1").verdict is Verdict.WA  # a number was expected
    assert judge_bounded("x+1", r"\boxed{1+x}") is None  # needs math-verify
    assert judge_bounded("1/2", r"\boxed{\sin(\pi/6)}") is None
