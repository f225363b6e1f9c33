"""The pure math judge: verdicts, tolerance, the spec's false positives."""

import pytest

from verifiers.errors import ConfigError
from verifiers.math.judge import MathConfig, judge_math
from verifiers.outcome import Verdict


@pytest.mark.parametrize(
    "gold, answer",
    [
        ("1/2004!", "1/2006!"),
        ("1/2^99", "1/2^98"),
        ("1e-7", "2e-7"),
        (r"4\sqrt(2)", "4"),
        ("4", r"4\sqrt(2)"),
    ],
)
def test_known_false_positives_are_wrong(gold, answer):
    for g, a in ((gold, answer), (f"${gold}$", rf"\boxed{{{answer}}}")):
        outcome = judge_math(g, a)
        assert outcome.verdict is Verdict.WA, outcome.detail
        assert outcome.reward == 0.0 and not outcome.passed


@pytest.mark.parametrize(
    "gold, response",
    [
        (r"\frac12", "The answer is $0.5$."),
        ("1/2", r"\boxed{\dfrac{2}{4}}"),
        ("x^2+1", r"\boxed{1+x^2}"),
        (r"\{1,2\}", r"\boxed{\{2,1\}}"),
        ("5", "so x = 5"),
        (r"\frac{\pi}{3}", r"\boxed{\pi/3}"),
        ("1/2", r"\sin(\pi/6)"),
        ("#### 1,000", "they pay #### 1000"),
        (r"\sqrt{8}", r"\boxed{2\sqrt{2}}"),
        ("(1,2]", r"\boxed{(1,2]}"),
    ],
)
def test_equal_answers_pass(gold, response):
    outcome = judge_math(gold, response)
    assert outcome.verdict is Verdict.AC, outcome.detail
    assert outcome.reward == 1.0


@pytest.mark.parametrize(
    "gold, response",
    [("(1,2]", r"\boxed{[1,2]}"), ("x", r"\boxed{y}"), ("5", "first 5 then finally 7"), ("3", "0.333333")],
)
def test_different_answers_fail(gold, response):
    assert judge_math(gold, response).verdict is Verdict.WA


def test_missing_answer_is_parse_error_and_bad_gold_is_internal_error():
    assert judge_math("5", "no idea at all").verdict is Verdict.PARSE_ERROR
    assert judge_math("   ", "5").verdict is Verdict.INTERNAL_ERROR


def test_tolerance_is_exact_rational():
    # |3.1416 - 3.14159| = 1e-5 <= 1e-4 * 3.1416, but > 1e-6 * 3.1416
    assert judge_math("3.14159", "3.1416", MathConfig(rel_tol="1e-4")).verdict is Verdict.AC
    assert judge_math("3.14159", "3.1416", MathConfig(rel_tol="1e-6")).verdict is Verdict.WA
    assert judge_math("3.14159", "3.1416").verdict is Verdict.WA
    assert judge_math("1", "1.05", MathConfig(abs_tol="1/10")).verdict is Verdict.AC


def test_no_extract_takes_the_text_whole():
    extracted = judge_math("5", "The answer is 5")
    assert extracted.verdict is Verdict.AC and "(answer_is)" in extracted.detail
    whole = judge_math("5", " 5 ", MathConfig(extract=False))
    assert whole.verdict is Verdict.AC and "(whole)" in whole.detail


def test_bad_tolerance_names_the_value():
    with pytest.raises(ConfigError, match="'abc'"):
        MathConfig(rel_tol="abc")
    with pytest.raises(ConfigError, match="negative"):
        MathConfig(abs_tol="-1")


def test_outcome_is_deterministic_and_named():
    a, b = judge_math("1/3", r"\boxed{2/6}"), judge_math("1/3", r"\boxed{2/6}")
    assert a == b
    assert a.verifier == "math" and a.version.startswith("math/2+math-verify/")
