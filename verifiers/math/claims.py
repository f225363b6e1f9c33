"""What a final answer claims: its alternatives (``A or B``) and the sides of an equation chain.

Pure string functions on normalised answer text (``extract.normalize``). Both split only at the
top level: an ``or`` or ``=`` inside braces or brackets belongs to a sub-expression.

- ``alternatives("3/4 \\text{ or } 1/2")`` is ``["3/4", "1/2"]``: the words ``or`` (bare or in
  ``\\text{}``) and ``\\lor`` separate alternatives;
- ``sides("x = 2/4 = 1/2")`` is ``["x", "2/4", "1/2"]``, and ``is_label("x")``: a side that is a
  bare name (a letter or Greek letter, maybe subscripted, maybe ``f(x)``) names the value, it is
  not a value (``<=``, ``>=``, ``!=`` and ``==`` are not splits);
- ``free_variable("2x+1")`` is ``"x"``: a lone letter outside commands and ``\\text{}`` (not
  ``e`` or ``i``, which name constants); an answer with one is not a number.
"""

from __future__ import annotations

import re

_OR = re.compile(
    r"\\(?:text|mbox|textrm|mathrm|textnormal)\s*\{\s*or\s*\}|(?<![A-Za-z\\])or(?![A-Za-z])"
    r"|\\lor(?![A-Za-z])",
    re.IGNORECASE,
)
_EQUALS = re.compile(r"(?<![<>!=:\\])=(?!=)")
_OPENERS, _CLOSERS = "([{", ")]}"
_GREEK = (
    "alpha|beta|gamma|delta|epsilon|varepsilon|zeta|eta|theta|vartheta|iota|kappa|lambda|mu|nu"
    "|xi|rho|sigma|tau|upsilon|phi|varphi|chi|psi|omega|Gamma|Delta|Theta|Lambda|Xi|Sigma|Phi"
    "|Psi|Omega"
)
_LABEL = re.compile(
    rf"^(?:[a-zA-Z]|\\(?:{_GREEK}))(?:_\{{?\w+\}}?)?(?:\(\s*[a-zA-Z](?:\s*,\s*[a-zA-Z])*\s*\))?$"
)


_TEXT_GROUP = re.compile(r"\\(?:text|textbf|textrm|mbox|mathrm|operatorname)\s*\{[^{}]*\}|\\[a-zA-Z]+")
_LONE_LETTER = re.compile(r"(?<![A-Za-z])[A-DF-HJ-Za-df-hj-z](?![A-Za-z])")


def _split_top(text: str, separator: re.Pattern) -> list[str]:
    """``text`` split at the matches of ``separator`` outside brackets, pieces stripped."""
    pieces, start, depth, scanned = [], 0, 0, 0
    for m in separator.finditer(text):
        segment = text[scanned : m.start()]
        depth += sum(segment.count(c) for c in _OPENERS) - sum(segment.count(c) for c in _CLOSERS)
        scanned = m.start()
        if depth <= 0:
            pieces.append(text[start : m.start()])
            start = m.end()
    pieces.append(text[start:])
    return [p.strip() for p in pieces]


def alternatives(text: str) -> list[str]:
    """The alternatives an answer offers, commas around each ``or`` dropped; empty ones too."""
    parts = (p.strip(",").strip() for p in _split_top(text, _OR))
    return [p for p in parts if p]


def sides(text: str) -> list[str]:
    """The sides of an equation chain (one side for an expression)."""
    return _split_top(text, _EQUALS)


def is_label(side: str) -> bool:
    """A bare name such as ``x``, ``a_1``, ``\\theta`` or ``f(x)``: it names a value."""
    return bool(_LABEL.match(side))


def free_variable(text: str) -> str | None:
    """The first lone letter of ``text`` that names a variable, or None."""
    m = _LONE_LETTER.search(_TEXT_GROUP.sub(" ", text))
    return m.group(0) if m else None
