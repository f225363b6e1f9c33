"""Judge a math answer against a reference: the pure core of the math verifier.

Steps, each final when it applies:

1. extract the final answer from the response and the reference (``extract``), normalise both;
2. identical text after normalisation: ``AC``;
3. both are constants in the exact grammar (``exact.parse_constant``): compare exact values,
   ``a == b`` (rationals) or ``simplify(a - b) == 0``; with a stated tolerance,
   ``|a - b| <= max(rel_tol * max(|a|, |b|), abs_tol)`` evaluated exactly for rationals;
4. otherwise parse both with math-verify (LaTeX, then plain expressions). Two numeric constants
   are still compared exactly as in 3 (math-verify's 6-digit rounding calls ``1/2^99`` equal to
   ``1/2^98``); anything symbolic (variables, sets, intervals, equations, matrices) goes to
   ``math_verify.verify(gold, answer, float_rounding=6, strict=True)``.

math-verify's own timeouts are off here (they rely on ``signal.alarm``, main thread only); the
caller bounds the time from outside (``pool.MathVerifier``).
"""

from __future__ import annotations

import dataclasses
import fractions
import importlib.metadata
import logging
import re

import sympy

from verifiers.errors import ConfigError
from verifiers.math.exact import parse_constant
from verifiers.math.extract import Extracted, extract_answer, extract_gold, normalize
from verifiers.outcome import Outcome, Verdict

_RULES_VERSION = "1"
_ASSIGNMENT = re.compile(r"^[a-zA-Z](?:_\{?\w+\}?)?\s*=\s*(?P<rhs>[^=]+)$")
_DIGITS = 60  # working precision when exact simplification cannot decide


def version() -> str:
    """The math verifier's version: its own rules and the math-verify release it leans on."""
    try:
        mv = importlib.metadata.version("math-verify")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a declared dependency
        mv = "absent"
    return f"math/{_RULES_VERSION}+math-verify/{mv}"


def _fraction(value: str | float | int | fractions.Fraction | None, name: str):
    if value is None:
        return None
    try:
        f = fractions.Fraction(str(value))
    except (ValueError, ZeroDivisionError):
        raise ConfigError(f"{name} {value!r} is not a number; give e.g. 1e-6 or 1/1000") from None
    if f < 0:
        raise ConfigError(f"{name} {value!r} is negative; give a tolerance >= 0")
    return f


@dataclasses.dataclass(frozen=True)
class MathConfig:
    """How a math answer is judged.

    Attributes:
      extract: find the final answer in a free-form response (else the text is the answer).
      rel_tol: relative tolerance for numbers, exact rational (``"1e-6"``); None: exact.
      abs_tol: absolute tolerance for numbers; None: exact.
    """

    extract: bool = True
    rel_tol: fractions.Fraction | None = None
    abs_tol: fractions.Fraction | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "rel_tol", _fraction(self.rel_tol, "rel_tol"))
        object.__setattr__(self, "abs_tol", _fraction(self.abs_tol, "abs_tol"))


def _strip_assignment(text: str, other: str) -> str:
    """``x = 5`` becomes ``5`` unless the other side is an equation too."""
    if "=" in other:
        return text
    m = _ASSIGNMENT.match(text)
    return m.group("rhs").strip() if m else text


def constants_equal(a: sympy.Expr, b: sympy.Expr, config: MathConfig) -> bool:
    """Exact (or stated-tolerance) equality of two numeric constants."""
    diff = a - b
    if config.rel_tol is None and config.abs_tol is None:
        if a.is_Rational and b.is_Rational:
            return bool(a == b)
        if sympy.simplify(diff) == 0:
            return True
        decided = diff.equals(0)
        if decided is not None:
            return bool(decided)
        scale = max(abs(sympy.N(a, _DIGITS)), abs(sympy.N(b, _DIGITS)), 1)
        return bool(abs(sympy.N(diff, _DIGITS)) <= sympy.Float(10) ** (-(_DIGITS - 10)) * scale)
    rel = sympy.Rational(config.rel_tol or 0)
    abs_ = sympy.Rational(config.abs_tol or 0)
    if a.is_Rational and b.is_Rational:
        return bool(abs(diff) <= max(rel * max(abs(a), abs(b)), abs_))
    lhs = abs(sympy.N(diff, _DIGITS))
    return bool(lhs <= max(rel * max(abs(sympy.N(a, _DIGITS)), abs(sympy.N(b, _DIGITS))), abs_))


def _mv_parse(text: str) -> list:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    return parse(
        f"${text}$",
        extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
        parsing_timeout=None,
    )


def _is_constant(x: object) -> bool:
    return isinstance(x, sympy.Expr) and bool(x.is_number) and not x.has(sympy.zoo, sympy.nan)


def judge_math(gold: str, response: str, config: MathConfig = MathConfig()) -> Outcome:
    """Judge ``response`` against the reference ``gold``; never raises for bad answers.

    No time bound of its own: call it through ``verify_math`` or a ``MathVerifier`` for that.
    """
    ver = version()

    def outcome(verdict: Verdict, detail: str) -> Outcome:
        return Outcome(verdict=verdict, detail=detail, verifier="math", version=ver)

    ref = extract_gold(gold)
    ref_text = normalize(ref.text)
    if not ref_text:
        return outcome(Verdict.INTERNAL_ERROR, f"reference answer {gold!r} is empty")
    found = extract_answer(response) if config.extract else Extracted(response.strip(), "whole")
    if found is None or not normalize(found.text):
        return outcome(Verdict.PARSE_ERROR, "no final answer found in the response")
    ans_text = normalize(found.text)
    ans_text, ref_text = _strip_assignment(ans_text, ref_text), _strip_assignment(ref_text, ans_text)
    shown = f"answer {ans_text!r} ({found.method}) vs reference {ref_text!r}"
    if ans_text == ref_text:
        return outcome(Verdict.AC, f"{shown}: identical")

    ref_value, ans_value = parse_constant(ref_text), parse_constant(ans_text)
    if ref_value is not None and ans_value is not None:
        equal = constants_equal(ans_value, ref_value, config)
        return outcome(Verdict.AC if equal else Verdict.WA, f"{shown}: {_word(equal)} (exact)")

    ref_parsed = [ref_value] if ref_value is not None else _mv_parse(ref_text)
    if not ref_parsed:
        return outcome(Verdict.INTERNAL_ERROR, f"reference answer {ref_text!r} could not be parsed")
    ans_parsed = [ans_value] if ans_value is not None else _mv_parse(ans_text)
    if not ans_parsed:
        return outcome(Verdict.PARSE_ERROR, f"answer {ans_text!r} could not be parsed")
    if _is_constant(ref_parsed[0]) and _is_constant(ans_parsed[0]):
        equal = constants_equal(ans_parsed[0], ref_parsed[0], config)
        return outcome(Verdict.AC if equal else Verdict.WA, f"{shown}: {_word(equal)} (exact)")

    from math_verify import verify

    gold_side = ref_parsed if len(ref_parsed) > 1 else [ref_parsed[0], ref_text]
    ans_side = ans_parsed if len(ans_parsed) > 1 else [ans_parsed[0], ans_text]
    equal = bool(verify(gold_side, ans_side, float_rounding=6, strict=True, timeout_seconds=None))
    return outcome(Verdict.AC if equal else Verdict.WA, f"{shown}: {_word(equal)} (symbolic)")


def _word(equal: bool) -> str:
    return "equal" if equal else "not equal"
