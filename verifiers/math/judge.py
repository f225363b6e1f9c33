"""Judge a math answer against a reference: the pure core of the math verifier.

Steps:

1. extract the final answer from the response and the reference (``extract``), normalise both;
2. read what each claims (``claims``): its alternatives and, for each, the sides of its equation;
3. compare each answer value with the reference value: identical text after normalisation is
   ``AC``; two constants in the exact grammar (``exact``) are compared exactly, ``a == b``
   (rationals) or ``simplify(a - b) == 0``, or with a stated tolerance
   ``|a - b| <= max(rel_tol * max(|a|, |b|), abs_tol)`` evaluated exactly for rationals; anything
   else is parsed by math-verify (LaTeX, then plain expressions): two numeric constants are still
   compared exactly (math-verify's 6-digit rounding calls ``1/2^99`` equal to ``1/2^98``),
   anything symbolic goes to ``math_verify.verify(gold, answer, float_rounding=6, strict=True)``.

What a response must claim to be right (each rule makes a hedge or a contradiction wrong):

- **Equation chains.** A side that is a bare name (``x``, ``a_1``, ``\\theta``, ``f(x)``) labels
  the value and is dropped; every other side must equal the reference. ``x = 1/2`` and
  ``2/4 = 1/2`` are right for ``1/2``; ``3/4 = 1/2`` is wrong. A reference that is itself an
  equation with two value sides (``x^2 + y^2 = 1``) is compared as a whole equation.
- **Hedges.** An answer ``A or B`` (``or``, ``\\text{ or }``, ``\\lor``; for the last-number rule,
  numbers chained by "or" in the text: "It is 3/4 or 1/2") is right only if every alternative is
  right: alternatives with different values are a hedge and wrong. A reference with alternatives
  (``2 or 3``) needs each of them given and nothing else.
- **Variables.** When the reference is a number (in the exact grammar), an answer with a free
  variable (a lone letter other than ``e`` and ``i``, outside commands and ``\\text{}``) is
  wrong without further parsing: ``x - x + 5`` is not accepted for ``5``.
- **Several boxed answers.** Every different ``\\boxed{}`` answer in the response is an
  alternative as above: ``\\boxed{3}`` then ``\\boxed{1/2}`` is a contradiction and wrong; the
  same answer boxed twice is fine.

Work is bounded before it is done: the response is at most ``extract.MAX_RESPONSE_CHARS``
characters, each answer at most ``exact.MAX_CHARS``, at most ``MAX_ALTERNATIVES`` alternatives
and ``MAX_SIDES`` sides; exact values have their size estimated before they are computed
(``exact``) and text for math-verify is size-checked first (``guard``). Beyond a bound the
verdict is ``PARSE_ERROR`` saying the answer is too large (``INTERNAL_ERROR`` for a reference).

``judge_bounded`` does only work that is bounded that way: no math-verify and no symbolic
simplification; it returns None when only those can decide. ``judge_math`` does everything; its
symbolic step has no time bound of its own (math-verify's timeouts rely on ``signal.alarm``, main
thread only and turned off here): ``pool.MathVerifier`` runs it in a process it can kill.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging

import sympy

from verifiers.math import claims
from verifiers.math.config import MathConfig
from verifiers.math.exact import MAX_CHARS, TooLarge, evaluate
from verifiers.math.extract import (
    MAX_RESPONSE_CHARS,
    Extracted,
    extract_answer,
    extract_gold,
    normalize,
)
from verifiers.math.guard import check_size
from verifiers.outcome import Outcome, Verdict

_RULES_VERSION = "2"
_DIGITS = 60  # working precision when exact simplification cannot decide
MAX_ALTERNATIVES = 8
MAX_SIDES = 8


@functools.cache
def version() -> str:
    """The math verifier's version: its own rules and the math-verify release it leans on."""
    try:
        mv = importlib.metadata.version("math-verify")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a declared dependency
        mv = "absent"
    return f"math/{_RULES_VERSION}+math-verify/{mv}"


def constants_equal(a: sympy.Expr, b: sympy.Expr, config: MathConfig, prove: bool = True) -> bool | None:
    """Exact (or stated-tolerance) equality of two numeric constants.

    Without ``prove``, None when the two agree to ``_DIGITS`` digits but are not both rational:
    only symbolic simplification, whose cost is not bounded, could then decide.
    """
    diff = a - b
    if config.rel_tol is None and config.abs_tol is None:
        if a.is_Rational and b.is_Rational:
            return bool(a == b)
        scale = max(abs(sympy.N(a, _DIGITS)), abs(sympy.N(b, _DIGITS)), 1)
        close = abs(sympy.N(diff, _DIGITS)) <= sympy.Float(10) ** (-(_DIGITS - 10)) * scale
        if not close:
            return False
        if not prove:
            return None
        if sympy.simplify(diff) == 0:
            return True
        decided = diff.equals(0)
        return bool(decided) if decided is not None else True
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


class _NeedsSymbolic(Exception):
    """Only math-verify or symbolic simplification can decide (not in bounded mode)."""


class _Refused(Exception):
    """One side's text cannot be judged: ``whose`` is "answer" or "reference"."""

    def __init__(self, whose: str, text: str, reason: str, too_large: bool):
        super().__init__(reason)
        self.whose, self.text, self.reason, self.too_large = whose, text, reason, too_large


class _Comparer:
    """Compares answer values with reference values, caching what it read of each text."""

    def __init__(self, config: MathConfig, symbolic: bool):
        self.config = config
        self.symbolic = symbolic
        self._constants: dict[tuple[str, str], sympy.Expr | None] = {}
        self._parsed: dict[tuple[str, str], list] = {}

    def constant(self, text: str, whose: str) -> sympy.Expr | None:
        key = (whose, text)
        if key not in self._constants:
            try:
                self._constants[key] = evaluate(text)
            except TooLarge as e:
                raise _Refused(whose, text, str(e), too_large=True) from None
        return self._constants[key]

    def parsed(self, text: str, whose: str) -> list:
        key = (whose, text)
        if key not in self._parsed:
            try:
                check_size(text)
            except TooLarge as e:
                raise _Refused(whose, text, str(e), too_large=True) from None
            self._parsed[key] = _mv_parse(text)
            if not self._parsed[key]:
                raise _Refused(whose, text, "it could not be parsed", too_large=False)
        return self._parsed[key]

    def equal(self, answer: str, reference: str) -> tuple[bool, str]:
        """Whether two values are equal, and how that was decided."""
        if answer == reference:
            return True, "identical"
        ref_value, ans_value = self.constant(reference, "reference"), self.constant(answer, "answer")
        if ref_value is not None and ans_value is not None:
            equal = constants_equal(ans_value, ref_value, self.config, prove=self.symbolic)
            if equal is not None:
                return equal, "exact"
        if ref_value is not None and ans_value is None:
            name = claims.free_variable(answer)
            if name is not None:  # a number is expected: no need to parse a formula
                return False, f"the answer has the variable {name!r}; the reference is a number"
        if not self.symbolic:
            raise _NeedsSymbolic
        ref_parsed = [ref_value] if ref_value is not None else self.parsed(reference, "reference")
        ans_parsed = [ans_value] if ans_value is not None else self.parsed(answer, "answer")
        if _is_constant(ref_parsed[0]) and _is_constant(ans_parsed[0]):
            return bool(constants_equal(ans_parsed[0], ref_parsed[0], self.config)), "exact"
        from math_verify import verify

        gold_side = ref_parsed if len(ref_parsed) > 1 else [ref_parsed[0], reference]
        ans_side = ans_parsed if len(ans_parsed) > 1 else [ans_parsed[0], answer]
        equal = bool(verify(gold_side, ans_side, float_rounding=6, strict=True, timeout_seconds=None))
        return equal, "symbolic"

    def claim_equal(self, answer: str, reference: str) -> tuple[bool, str]:
        """Whether one answer alternative claims the reference alternative: every value side of
        its equation chain equal to the reference value (or, for an equation reference, equal
        as a whole equation)."""
        ref_sides = claims.sides(reference)
        ref_values = [v for v in ref_sides if not claims.is_label(v)]
        if len(ref_values) > 1:
            return self.equal(answer, reference)
        ref_value = ref_values[0] if ref_values else ref_sides[-1]
        ans_sides = claims.sides(answer)
        if len(ans_sides) > MAX_SIDES:
            raise _Refused("answer", answer, f"it has more than {MAX_SIDES} sides", too_large=True)
        if not all(ans_sides):
            raise _Refused("answer", answer, "an equation side is empty", too_large=False)
        values = [v for v in ans_sides if not claims.is_label(v)] or ans_sides[-1:]
        how = "identical"
        for value in values:
            equal, how = self.equal(value, ref_value)
            if not equal:
                return False, how
        return True, how


def _alternatives(stated: list[str], whose: str) -> list[str]:
    """The distinct normalised alternatives of the stated answers, in order."""
    out: dict[str, None] = {}
    for text in stated:
        if len(text) > MAX_CHARS:
            raise _Refused(whose, text[:40] + "...", f"it is longer than {MAX_CHARS} characters", too_large=True)
        for alt in claims.alternatives(normalize(text)):
            alt = normalize(alt)
            if alt:
                out[alt] = None
        if len(out) > MAX_ALTERNATIVES:
            raise _Refused(whose, text[:40], f"more than {MAX_ALTERNATIVES} alternatives", too_large=True)
    return list(out)


def judge_math(gold: str, response: str, config: MathConfig = MathConfig()) -> Outcome:
    """Judge ``response`` against the reference ``gold``; never raises for bad answers.

    The symbolic step has no time bound of its own: call it through ``verify_math`` or a
    ``MathVerifier`` for that.
    """
    return _judge(gold, response, config, symbolic=True)


def judge_bounded(gold: str, response: str, config: MathConfig = MathConfig()) -> Outcome | None:
    """``judge_math``'s outcome when bounded work decides it (no math-verify, no simplification),
    else None."""
    try:
        return _judge(gold, response, config, symbolic=False)
    except _NeedsSymbolic:
        return None


def _judge(gold: str, response: str, config: MathConfig, symbolic: bool) -> Outcome:
    ver = version()

    def outcome(verdict: Verdict, detail: str) -> Outcome:
        return Outcome(verdict=verdict, detail=detail, verifier="math", version=ver)

    if len(gold) > MAX_RESPONSE_CHARS:
        return outcome(Verdict.INTERNAL_ERROR, f"reference answer is longer than {MAX_RESPONSE_CHARS} characters")
    if len(response) > MAX_RESPONSE_CHARS:
        return outcome(Verdict.PARSE_ERROR, f"the response is longer than {MAX_RESPONSE_CHARS} characters")
    ref = extract_gold(gold)
    found = extract_answer(response) if config.extract else Extracted(response.strip(), "whole")
    comparer = _Comparer(config, symbolic)
    try:
        refs = _alternatives([ref.text], "reference")
        if not refs:
            return outcome(Verdict.INTERNAL_ERROR, f"reference answer {gold[:100]!r} is empty")
        answers = _alternatives([*found.earlier, found.text], "answer") if found is not None else []
        if not answers:
            return outcome(Verdict.PARSE_ERROR, "no final answer found in the response")
        assert found is not None  # the answers come from it
        shown = f"answer {' or '.join(answers)!r} ({found.method}) vs reference {' or '.join(refs)!r}"
        # each answer alternative must claim some reference alternative, and each be claimed
        claimed: set[str] = set()
        how = "identical"
        for answer in answers:
            for reference in refs:
                equal, how = comparer.claim_equal(answer, reference)
                if equal:
                    claimed.add(reference)
                    break
            else:
                return outcome(Verdict.WA, f"{shown}: {_wrong(answer, answers, refs, how)}")
        if len(claimed) < len(refs):
            missing = next(r for r in refs if r not in claimed)
            return outcome(Verdict.WA, f"{shown}: not equal (the reference's {missing!r} is not given)")
    except _Refused as e:
        if e.whose == "reference":
            return outcome(Verdict.INTERNAL_ERROR, f"reference answer {e.text!r} cannot be judged: {e.reason}")
        kind = "too large to judge" if e.too_large else "not judged"
        return outcome(Verdict.PARSE_ERROR, f"answer {e.text[:100]!r} is {kind}: {e.reason}")
    return outcome(Verdict.AC, f"{shown}: identical" if how == "identical" else f"{shown}: equal ({how})")


def _wrong(answer: str, answers: list[str], refs: list[str], how: str) -> str:
    if len(answers) > 1 and len(refs) == 1:
        return f"not equal ({answer!r} is wrong: several different answers are a hedge or a contradiction)"
    if len(answers) > 1 or len(refs) > 1:
        return f"not equal ({answer!r} is not a reference alternative)"
    return f"not equal ({how})"
