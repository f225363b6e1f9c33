"""What an answer claims: equation chains, hedges, several boxed answers, free variables.

One table of right and wrong answers; the rules are in ``verifiers.math.judge``'s docstring.
"""

import pytest

from verifiers.math import claims
from verifiers.math.judge import judge_bounded, judge_math
from verifiers.outcome import Verdict

AC, WA, PARSE_ERROR = Verdict.AC, Verdict.WA, Verdict.PARSE_ERROR

TABLE = [
    # equation chains: labels dropped, every other side must equal the reference
    ("1/2", r"\boxed{x = 1/2}", AC),
    ("1/2", r"\boxed{\frac{2}{4} = \frac{1}{2}}", AC),
    ("1/2", r"\boxed{x = \frac{2}{4} = 0.5}", AC),
    ("2", "1+1 = 2", AC),
    (r"\frac{\pi}{3}", r"\boxed{\theta = \frac{\pi}{3}}", AC),
    ("2x+1", r"\boxed{f(x) = 2x + 1}", AC),
    ("5", "so x = 5", AC),
    ("x = 5", "5", AC),
    ("y = 2x+1", r"\boxed{y = 1 + 2x}", AC),
    ("x^2+y^2=1", r"\boxed{x^2 + y^2 = 1}", AC),
    ("1/2", r"\boxed{3/4 = 1/2}", WA),  # a false equation whose right side matches
    ("1/2", r"\boxed{1/2 = 3/4}", WA),
    ("1/2", r"\boxed{x = 3/4 = 1/2}", WA),
    ("3", "1+1 = 3", WA),
    ("x^2+y^2=1", r"\boxed{x^2+y^2=2}", WA),
    # hedges: every alternative must be right
    ("1/2", "It is 1/2 or 0.5", AC),
    ("2 or 3", r"\boxed{3 \text{ or } 2}", AC),
    ("1/2", "It is 3/4 or 1/2", WA),
    ("1/2", "It is 1/2 or 3/4.", WA),
    ("1/2", "It is 3/4, or 1/2", WA),
    ("1/2", "The answer is 3/4 or 1/2.", WA),
    ("1/2", r"\boxed{3/4 \text{ or } 1/2}", WA),
    ("1/2", r"\boxed{3/4 \lor 1/2}", WA),
    ("2 or 3", r"\boxed{2}", WA),  # a reference alternative missing
    ("2 or 3", r"\boxed{2 \text{ or } 3 \text{ or } 4}", WA),
    ("10", "I tried 3 or 4 first; the answer is 10", AC),  # only the final answer counts
    # several boxed answers: different ones contradict each other
    ("1/2", r"\boxed{1/2} and again \boxed{1/2}", AC),
    ("1/2", r"\boxed{1/2}, that is \boxed{0.5}", AC),
    ("1/2", r"\boxed{3}\boxed{1/2}", WA),
    ("1/2", r"first \boxed{1/2}, then \boxed{3}", WA),
    # a number is expected: a free variable is wrong without parsing a formula
    ("5", r"\boxed{x - x + 5}", WA),
    ("5", r"\boxed{5x}", WA),
    ("122", "1y2 2", WA),
    ("2", r"\boxed{2e}", WA),  # e is Euler's number: a constant, compared as one
    # plain right and wrong answers stay as they were
    ("42", "The final answer is 42.", AC),
    ("12", "I counted 12 apples.", AC),
    ("-2", "The answer is $-2$.", AC),
    ("1,000", r"\boxed{1000}", AC),
    ("1/2", r"\boxed{\sin(\pi/6)}", AC),
    ("(1,2]", r"\boxed{(1,2]}", AC),
    (r"\{1,2\}", r"\boxed{\{2,1\}}", AC),
    (r"\pi", r"\boxed{\pi}", AC),
    (r"\sqrt{8}", r"\boxed{2\sqrt{2}}", AC),
    ("x^2+1", r"\boxed{1+x^2}", AC),
    ("(1,2]", r"\boxed{[1,2]}", WA),
    ("1/2004!", r"\boxed{1/2006!}", WA),
    ("1e-7", "2e-7", WA),
    ("7", "no idea at all", PARSE_ERROR),
    ("1/2", r"\boxed{1 = }", PARSE_ERROR),
]


@pytest.mark.parametrize("gold, response, verdict", TABLE)
def test_rules(gold, response, verdict):
    outcome = judge_math(gold, response)
    assert outcome.verdict is verdict, outcome.detail
    assert outcome.reward == (1.0 if verdict is AC else 0.0)


@pytest.mark.parametrize("gold, response, verdict", TABLE)
def test_bounded_judging_agrees_or_defers(gold, response, verdict):
    """The in-process bounded judge gives the full judge's outcome, or defers (None)."""
    bounded = judge_bounded(gold, response)
    assert bounded is None or bounded == judge_math(gold, response)


def test_hedge_and_contradiction_details_say_why():
    hedge = judge_math("1/2", "It is 3/4 or 1/2")
    assert "'3/4' is wrong" in hedge.detail and "hedge or a contradiction" in hedge.detail
    boxes = judge_math("1/2", r"\boxed{3}\boxed{1/2}")
    assert boxes.detail.startswith("answer '3 or 1/2' (boxed)")


@pytest.mark.parametrize(
    "text, parts",
    [
        ("3/4 or 1/2", ["3/4", "1/2"]),
        (r"3/4 \text{ or } 1/2", ["3/4", "1/2"]),
        (r"1, or 2 \lor 3", ["1", "2", "3"]),
        (r"\{1 or 2\}", [r"\{1 or 2\}"]),  # inside braces: part of one value
        ("color", ["color"]),
        ("x^2+1", ["x^2+1"]),
    ],
)
def test_alternatives(text, parts):
    assert claims.alternatives(text) == parts


@pytest.mark.parametrize(
    "text, parts",
    [
        ("x = 2/4 = 1/2", ["x", "2/4", "1/2"]),
        ("x <= 3", ["x <= 3"]),
        ("a == b", ["a == b"]),
        (r"f(x = 1) = 2", ["f(x = 1)", "2"]),
    ],
)
def test_sides(text, parts):
    assert claims.sides(text) == parts


def test_labels_and_free_variables():
    assert all(claims.is_label(t) for t in ["x", "a_1", "a_{12}", r"\theta", "f(x)", "g(x, y)"])
    assert not any(claims.is_label(t) for t in ["2", "xy", r"\pi", "x+1", r"\frac{1}{2}"])
    assert claims.free_variable("2x+1") == "x"
    assert claims.free_variable(r"\frac{\pi}{3} + \sqrt{2} + e + i") is None
    assert claims.free_variable(r"5 \text{ apples}") is None
    assert claims.free_variable(r"\sin(y)") == "y"
