"""Find the final answer in a model's response, and normalise answer text.

Pure string functions. The rules, tried in order on a response:

1. the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; other boxed answers that
   differ from it are kept too (``Extracted.earlier``): the judge treats them as a contradiction;
2. the last "final answer is X" / "answer is X" / "Answer: X" on one line;
3. the last GSM8K-style ``#### X``;
4. the whole response when it is a bare formula (no words, one line: ``x+1``, ``\\frac{1}{2}``);
5. the last number in the text, with the numbers chained to it by "or" (``3/4 or 1/2``): a
   hedge, which the judge marks wrong unless every alternative is right.

Every scan is linear in the text: unclosed ``\\boxed{`` groups (thousands of them) cost one pass.

A reference answer ("gold") is taken whole unless it carries a ``\\boxed{}`` or ``####`` marker.
"""

from __future__ import annotations

import dataclasses
import re

_BOX_OR_BRACE = re.compile(r"(?P<box>\\(?:boxed|fbox)\s*)|(?P<brace>[{}])")
_BOX_TOKEN = re.compile(r"[^\s$]+")
_ANSWER_IS = re.compile(
    r"(?:final\s+answer|answer)\s*(?:is\s*:?|:|=)\s*(?P<ans>[^\n]+)", re.IGNORECASE
)
_HASHES = re.compile(r"####\s*(?P<ans>[^\n]+)")
_WORD = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{2,}")
_FUNCTION_WORDS = frozenset({"sqrt", "sin", "cos", "tan", "log", "ln", "exp", "pi", "infty", "frac"})
_NUMBER_TEXT = (
    r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*/\s*\d+)?"
    r"|(?<![\w.])-?\.\d+"
)
_NUMBER = re.compile(_NUMBER_TEXT)
_HEDGED = re.compile(rf"(?:{_NUMBER_TEXT})\s*,?\s+or\s+$", re.IGNORECASE)  # "3/4 or " before a number
_HEDGE_LOOKBACK = 200  # characters searched before a number for "X or"
MAX_HEDGED = 8
MAX_RESPONSE_CHARS = 100_000  # the judge refuses longer responses (PARSE_ERROR) before reading them


@dataclasses.dataclass(frozen=True)
class Extracted:
    """An answer found in a text, and the rule that found it."""

    text: str
    method: str  # "boxed", "answer_is", "hashes", "formula", "last_number" or "whole"
    earlier: tuple[str, ...] = ()  # boxed answers before ``text`` that differ from it, in order


def boxed_answers(text: str) -> list[str]:
    """The contents of the outermost closed ``\\boxed{...}`` groups (and ``\\boxed 5`` tokens
    outside any group), in order; a box inside a box that never closes counts as outermost.

    One pass over the braces with a stack: an unclosed group is never closed and never scanned
    again, so thousands of unclosed ``\\boxed{`` cost linear time.
    """
    closed: list[tuple[int, int]] = []  # (where the content starts, where it ends)
    tokens: list[tuple[int, int]] = []
    stack: list[tuple[bool, int]] = []  # per open brace: does it open a box, and where
    box_brace_at = -1  # where the brace of the last "\boxed" must be
    for m in _BOX_OR_BRACE.finditer(text):
        if m.group("box") is not None:
            if m.end() < len(text) and text[m.end()] == "{":
                box_brace_at = m.end()
            else:  # "\boxed 5": one token
                token = _BOX_TOKEN.match(text, m.end())
                if token:
                    tokens.append(token.span())
        elif m.group("brace") == "{":
            stack.append((m.start() == box_brace_at, m.start()))
        elif stack:
            is_box, start = stack.pop()
            if is_box:
                closed.append((start + 1, m.start()))
    # closed groups nest or are disjoint: in order of their start, an outer one comes first
    spans = sorted(closed + tokens)
    outermost: list[tuple[int, int]] = []
    for start, end in spans:
        if not outermost or start > outermost[-1][1]:
            outermost.append((start, end))
    return [text[start:end] for start, end in outermost]


def _last_boxed(text: str) -> tuple[str, tuple[str, ...]] | None:
    """The last non-empty boxed answer and the different ones before it."""
    boxes = [b.strip() for b in boxed_answers(text) if b.strip()]
    if not boxes:
        return None
    last = boxes[-1]
    earlier = tuple(dict.fromkeys(b for b in boxes[:-1] if b != last))
    return last, earlier


def _hedged_number(text: str, match: re.Match) -> str:
    """The last number, with the numbers chained before it by "or": ``3/4 or 1/2``."""
    parts, start = [match.group(0)], match.start()
    while len(parts) < MAX_HEDGED:
        window = max(0, start - _HEDGE_LOOKBACK)
        before = _HEDGED.search(text, window, start)
        if before is None:
            break
        number = _NUMBER.match(text, before.start())
        assert number is not None  # _HEDGED's match starts with a number
        parts.insert(0, number.group(0))
        start = before.start()
    return " or ".join(parts)


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
    if boxed is not None:
        return Extracted(boxed[0], "boxed", boxed[1])
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
        return Extracted(_hedged_number(response, numbers[-1]), "last_number")
    return None


def extract_gold(gold: str) -> Extracted:
    """The reference answer: its boxed or ``####`` part if marked, else the whole text."""
    boxed = _last_boxed(gold)
    if boxed is not None:
        return Extracted(boxed[0], "boxed")
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
