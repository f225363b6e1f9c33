"""Final-answer extraction and normalisation."""

import pytest

from verifiers.math.extract import (
    boxed_answers,
    extract_answer,
    extract_gold,
    normalize,
)


@pytest.mark.parametrize(
    "response, text, method",
    [
        (r"so we get \boxed{\frac{1}{2}} in the end", r"\frac{1}{2}", "boxed"),
        (r"first \boxed{1}, then \boxed{2}", "2", "boxed"),  # the last box wins
        (r"nested \boxed{\{1, \{2\}\}}", r"\{1, \{2\}\}", "boxed"),
        (r"\fbox{7}", "7", "boxed"),
        (r"\boxed 5 done", "5", "boxed"),
        ("I think 3. The final answer is 42.", "42", "answer_is"),
        ("Answer: **x+1**", "x+1", "answer_is"),
        ("work 12 more work\n#### 1,000", "1,000", "hashes"),
        ("x^2+1", "x^2+1", "formula"),
        (r"\frac{\pi}{3}", r"\frac{\pi}{3}", "formula"),
        ("I tried 3 then 5 and finally 7 apples", "7", "last_number"),
        ("the value is -0.25 exactly", "-0.25", "last_number"),
        ("costs 3/4 of it", "3/4", "last_number"),
    ],
)
def test_extract_answer(response, text, method):
    found = extract_answer(response)
    assert found is not None
    assert (found.text, found.method) == (text, method)


def test_no_answer_is_none():
    assert extract_answer("I do not know the answer to that") is None
    assert extract_answer("") is None


def test_gold_is_taken_whole_unless_marked():
    assert extract_gold(" x + 1 ").text == "x + 1"
    assert extract_gold(r"\boxed{3}").text == "3"
    assert extract_gold("step 1 gives 5\n#### 6").text == "6"


@pytest.mark.parametrize(
    "raw, clean",
    [
        (r"$\dfrac{1}{2}$.", r"\frac{1}{2}"),
        (r"\(3\)", "3"),
        (r"$$\left( 1, 2 \right)$$", "( 1, 2 )"),
        ("1,000,000", "1000000"),
        ("1,2", "1,2"),  # not a thousands separator: a pair stays a pair
        (r"90^\circ", "90"),
        (r"50\%", "50"),
        (r"5\,\text{cm}", "5"),
        (r"\text{(B)}", "(B)"),
    ],
)
def test_normalize(raw, clean):
    assert normalize(raw) == clean


@pytest.mark.parametrize(
    "response, text, earlier",
    [
        (r"\boxed{3}\boxed{1/2}", "1/2", ("3",)),
        (r"\boxed{1/2} twice \boxed{1/2}", "1/2", ()),
        (r"\boxed{1} \boxed{2} \boxed{1} \boxed{3}", "3", ("1", "2")),
        (r"\boxed{a{b}c} \boxed{", "a{b}c", ()),  # an unclosed box is no answer
        (r"\boxed{\frac{1}{2}} and \boxed 7", "7", (r"\frac{1}{2}",)),
    ],
)
def test_every_boxed_answer_is_kept(response, text, earlier):
    found = extract_answer(response)
    assert (found.text, found.method, found.earlier) == (text, "boxed", earlier)


def test_boxed_scan_is_linear():
    assert boxed_answers(r"\boxed{" * 14_000) == []  # the old scan was quadratic: seconds
    assert boxed_answers(r"\boxed{" * 14_000 + "1}") == ["1"]  # the only closed box
    assert boxed_answers("{" * 10_000 + r"\boxed{2}") == ["2"]


@pytest.mark.parametrize(
    "response, text",
    [
        ("It is 3/4 or 1/2", "3/4 or 1/2"),
        ("It is 3/4, or 1/2.", "3/4 or 1/2"),
        ("maybe 1 or 2 or 3", "1 or 2 or 3"),
        ("I had 3 apples or more, then 5", "5"),  # "or" not between two numbers
        ("12 or so apples, total 5", "5"),
    ],
)
def test_hedged_last_number(response, text):
    found = extract_answer(response)
    assert (found.text, found.method) == (text, "last_number")
