"""Find the final answer in a model's response, and normalise answer text.

Pure string functions. The rules, tried in order on a response:

1. the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced;
2. the last "final answer is X" / "answer is X" / "Answer: X" on one line;
3. the last GSM8K-style ``#### X``;
4. the whole response when it is a bare formula (no words, one line: ``x+1``, ``\\frac{1}{2}``);
5. the last number in the text.

A reference answer ("gold") is taken whole unless it carries a ``\\boxed{}`` or ``####`` marker.
"""

from __future__ import annotations

import dataclasses
import re

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*")
_ANSWER_IS = re.compile(
    r"(?:final\s+answer|answer)\s*(?:is\s*:?|:|=)\s*(?P<ans>[^\n]+)", re.IGNORECASE
)
_HASHES = re.compile(r"####\s*(?P<ans>[^\n]+)")
_WORD = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{2,}")
_FUNCTION_WORDS = frozenset({"sqrt", "sin", "cos", "tan", "log", "ln", "exp", "pi", "infty", "frac"})
_NUMBER = re.compile(
    r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*/\s*\d+)?"
    r"|(?<![\w.])-?\.\d+"
)


@dataclasses.dataclass(frozen=True)
class Extracted:
    """An answer found in a text, and the rule that found it."""

    text: str
    method: str  # "boxed", "answer_is", "hashes", "formula", "last_number" or "whole"


def _balanced(text: str, open_at: int) -> str | None:
    """The content of the brace group opening at ``text[open_at] == '{'``, or None if unclosed."""
    depth = 0
    for i in range(open_at, len(text)):
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
    return None


def _last_boxed(text: str) -> str | None:
    for m in reversed(list(_BOXED.finditer(text))):
        start = m.end()
        if start < len(text) and text[start] == "{":
            content = _balanced(text, start)
            if content is not None:
                return content
        else:  # "\boxed 5": one token
            token = re.match(r"[^\s$]+", text[start:])
            if token:
                return token.group(0)
    return None


def _clean_tail(ans: str) -> str:
    ans = ans.strip()
    ans = re.sub(r"^\*+|\*+$", "", ans).strip()  # markdown bold
    ans = ans.rstrip(".").strip()
    return ans


def _is_formula(text: str) -> bool:
    """One short line without English words (LaTeX commands and function names allowed)."""
    text = text.strip()
    if not text or "\n" in text or len(text) > 200:
        return False
    return all(w.group(0).lower() in _FUNCTION_WORDS for w in _WORD.finditer(text))


def extract_answer(response: str) -> Extracted | None:
    """The final answer of a model's response, or None when it gives none."""
    boxed = _last_boxed(response)
    if boxed is not None and boxed.strip():
        return Extracted(boxed.strip(), "boxed")
    matches = list(_ANSWER_IS.finditer(response))
    if matches:
        ans = _clean_tail(matches[-1].group("ans"))
        if ans:
            return Extracted(ans, "answer_is")
    matches = list(_HASHES.finditer(response))
    if matches:
        ans = _clean_tail(matches[-1].group("ans"))
        if ans:
            return Extracted(ans, "hashes")
    if _is_formula(response):
        return Extracted(response.strip(), "formula")
    numbers = list(_NUMBER.finditer(response))
    if numbers:
        return Extracted(numbers[-1].group(0), "last_number")
    return None


def extract_gold(gold: str) -> Extracted:
    """The reference answer: its boxed or ``####`` part if marked, else the whole text."""
    boxed = _last_boxed(gold)
    if boxed is not None and boxed.strip():
        return Extracted(boxed.strip(), "boxed")
    matches = list(_HASHES.finditer(gold))
    if matches:
        return Extracted(_clean_tail(matches[-1].group("ans")), "hashes")
    return Extracted(gold.strip(), "whole")


_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_DROP = re.compile(
    r"\\left|\\right|\\displaystyle|\\!|\\,|\\;|\\:|\\ |~|\\\$|\\%|%|\^\s*\{?\\circ\}?|\\circ"
)
_UNIT = re.compile(r"^(?P<value>.*?\d)\s*\\(?:text|mbox|mathrm)\{[^{}]*\}$")
_TEXT = re.compile(r"^\\(?:text|mbox|mathrm|textbf)\{(?P<inner>[^{}]*)\}$")
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")


def normalize(answer: str) -> str:
    """Strip math delimiters, spacing commands, units, degree and percent signs.

    ``"$\\dfrac{1}{2}\\,\\text{cm}$."`` becomes ``"\\frac{1}{2}"``; ``"1,000"`` becomes
    ``"1000"`` (a thousands separator only when every group has three digits).
    """
    s = answer.strip().rstrip(".").strip()
    changed = True
    while changed:
        changed = False
        for left, right in _DELIMITERS:
            if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s = s[len(left) : len(s) - len(right)].strip()
                changed = True
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _DROP.sub("", s).strip()
    m = _UNIT.match(s)
    if m:
        s = m.group("value").strip()
    m = _TEXT.match(s)
    if m:
        s = m.group("inner").strip()
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    return s.rstrip(".").strip()
