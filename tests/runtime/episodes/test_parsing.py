"""Tool-call rules: stable names and digests; a malformed call is a parse result, never a raise."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.episodes import RULES, FenceRule, Parsed, TagRule, make_rule, rule_digest
from runtime.errors import UsageError


def test_tag_rule_reads_the_first_call():
    rule = TagRule()
    assert rule.parse("let me see <tool>calculator: 12*7 </tool> then") == Parsed(True, "calculator", "12*7")
    assert rule.parse("<tool>python:print(1)</tool><tool>calculator: 1</tool>").tool == "python"
    assert rule.parse("<tool> calculator : 1:2 </tool>") == Parsed(True, "calculator", "1:2")


def test_no_call_is_the_final_answer():
    assert TagRule().parse("the answer is 84") == Parsed(False)
    assert FenceRule().parse("84") == Parsed(False)


@pytest.mark.parametrize(("text", "why"), [
    ("<tool>calculator: 12*7", "without </tool>"),
    ("<tool>12*7</tool>", "no ':'"),
    ("<tool>Calc: 1</tool>", "is not [a-z_][a-z0-9_]*"),
    ("<tool>: 1</tool>", "is not [a-z_][a-z0-9_]*"),
    ("<tool>two words: 1</tool>", "is not [a-z_][a-z0-9_]*"),
])
def test_malformed_calls_are_outcomes(text, why):
    parsed = TagRule().parse(text)
    assert parsed.call and not parsed.tool
    assert why in parsed.malformed


def test_fence_rule_calls_python():
    assert FenceRule().parse("run:\n```python\nprint(6*7)\n```\ndone") == Parsed(True, "python", "print(6*7)\n")
    assert "without its closing" in FenceRule().parse("```python\nprint(1)\n").malformed


@given(st.text(max_size=200))
def test_any_text_parses_without_raising(text):
    for rule in RULES.values():
        parsed = rule.parse(text)
        assert parsed.call or parsed == Parsed(False)
        assert not (parsed.malformed and parsed.tool)


def test_names_and_digests_are_stable():
    # the digests are what the ledger will record: a change here must come with a new version
    assert TagRule().digest == rule_digest(TagRule()) == rule_digest(make_rule("tag"))
    assert TagRule().digest != TagRule(open="<call>", close="</call>").digest
    assert TagRule().digest != FenceRule().digest
    assert TagRule().digest == "68051759eafa8250c1357c8704084d0fcb71f15b11afbbef36d40e2fc70c0a41"
    assert FenceRule().digest == "dc98c617f8f836f7769b062017e993b5e82e65b2082faf9c462970a649e4682b"
    assert TagRule().syntax("calculator", "1+1") == "<tool>calculator: 1+1</tool>"
    with pytest.raises(UsageError, match="accepted: tag, fence"):
        make_rule("xml")
    with pytest.raises(UsageError, match="two different"):
        TagRule(open="|", close="|")
