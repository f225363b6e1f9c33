"""A size bound on answer text before math-verify and sympy see it.

math-verify parses LaTeX into sympy, and sympy evaluates numbers eagerly: ``\\{9^{9^{9}}\\}``
computes a 370-million-digit integer while parsing, ``\\prod_{k=1}^{10^{6}} k`` a factorial, and
``(x+1)^{5000}`` expands into thousands of terms when compared. ``check_size`` reads the text
once, without evaluating anything, and bounds from above how large any number in it could get;
text that could exceed the bounds raises ``TooLarge`` before any parsing starts.

The bound works on a loose reading of the tokens (it does not need to understand the formula,
only to over-estimate it). For each item it tracks ``bits``, an upper bound on ``log2`` of the
size of any value the item can produce:

- a number literal: its own bits; a letter or command: 1 bit; an operator: 0;
- a group ``( ... )``, ``{ ... }``, ``[ ... ]``: the sum over its items (a sum or product of
  values needs at most the sum of their bits, plus one per item);
- ``a^b``: ``bits(a) * |b|``, with ``|b| <= 2 ** bits(b)`` unless ``b`` is an integer literal;
  a base that is a sum with a variable (``x+1``) is a polynomial, and comparing expands its
  powers (``(x+1)^{1000}`` takes 15 s): their degrees added up are at most ``MAX_DEGREE``, and
  the terms the text could expand to (a sum adds, a product multiplies, ``(a+b+c)^n`` has
  ``C(n+2, 2)``) at most ``MAX_TERMS``;
- ``a!`` (and ``\\Gamma a``): ``|a| * log2 |a|``; ``\\binom{n}{k}``: ``min(bits(n) * |k|, |n|)``;
- a root (``\\sqrt``, or a power whose exponent is not an integer literal) of a value that could
  exceed ``exact.MAX_ROOT_BITS`` bits is refused: sympy's perfect-power search on it is slow.

Subscripts and the limits of ``\\sum``/``\\prod`` are items like any other (an upper limit is an
exponent), so ``\\prod_{k=1}^{10^{6}}`` is refused as a power would be.
"""

from __future__ import annotations

import math
import re

from verifiers.math.exact import (
    MAX_BITS,
    MAX_CHARS,
    MAX_NESTING,
    MAX_ROOT_BITS,
    TooLarge,
)

MAX_TERMS = 1_000  # (x+y+z+1)^{40} has 12341 terms and takes a minute to compare
MAX_DEGREE = 100  # powers of polynomials in all: (x+1)^{200} already takes 1-2 s to compare

_TOKEN = re.compile(
    r"(?P<num>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+)|(?P<cmd>\\[a-zA-Z]+|\\.)|(?P<letter>[a-zA-Z])"
    r"|(?P<other>\S)"
)
_OPEN = {"(", "[", "{", "\\{", "\\lbrace", "\\langle", "\\lfloor", "\\lceil", "\\lvert"}
_CLOSE = {")", "]", "}", "\\}", "\\rbrace", "\\rangle", "\\rfloor", "\\rceil", "\\rvert"}
_FACTORIAL_LIKE = {"\\Gamma", "\\operatorname"}
_BINOMIAL = {"\\binom", "\\dbinom", "\\tbinom"}
_CAP = 1e300  # bits beyond MAX_BITS are all "too large"; keep floats finite


class _Item:
    """What ``check_size`` knows of a piece of text."""

    __slots__ = ("bits", "degree", "integer", "polynomial", "terms", "variable")

    def __init__(
        self,
        bits: float,
        integer: int | None = None,
        variable: bool = False,
        polynomial: bool = False,
        degree: float = 0.0,
        terms: float = 1.0,
    ):
        if bits > MAX_BITS:
            raise TooLarge(f"it could hold a number beyond {MAX_BITS} bits")
        if degree > MAX_DEGREE:
            raise TooLarge(f"it holds powers of polynomials beyond degree {MAX_DEGREE} in all")
        if terms > MAX_TERMS:
            raise TooLarge(f"it could expand to more than {MAX_TERMS} terms")
        self.bits = bits
        self.integer = integer  # the value, when the item is an integer literal
        self.variable = variable  # holds a letter
        self.polynomial = polynomial  # holds a sum with a letter: a power of it expands
        self.degree = degree  # the degrees of the powers of polynomials in it, added up
        self.terms = terms  # how many terms it could expand to

    def magnitude(self) -> float:
        """An upper bound on the item's absolute value."""
        if self.integer is not None:
            return float(self.integer)
        return 2.0**self.bits if self.bits < 1000 else _CAP


class _Reader:
    def __init__(self, text: str):
        # every alternative of _TOKEN is one named group: the group's text is the whole match
        self.tokens = [(m.lastgroup, m.group()) for m in _TOKEN.finditer(text)]
        self.pos = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos][1] if self.pos < len(self.tokens) else None

    def sequence(self) -> _Item:
        """Items up to a closing bracket (taken) or the end."""
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise TooLarge(f"it nests deeper than {MAX_NESTING}")
        items: list[_Item] = []
        addends = 1
        while self.pos < len(self.tokens):
            if self.peek() in _CLOSE:
                self.pos += 1
                break
            addends += self.peek() in ("+", "-", ",")
            items.append(self.item())
        self.depth -= 1
        if len(items) == 1:
            return items[0]
        variable = any(i.variable for i in items)
        polynomial = any(i.polynomial for i in items) or (variable and addends > 1)
        degree = sum(i.degree for i in items)
        terms = addends * math.prod(min(i.terms, _CAP) for i in items)  # a sum of products
        return _Item(
            sum(i.bits + 1 for i in items), variable=variable, polynomial=polynomial, degree=degree,
            terms=min(terms, _CAP),
        )

    def item(self) -> _Item:
        value = self.primary()
        while self.peek() in ("^", "!", "_"):
            op = self.tokens[self.pos][1]
            self.pos += 1
            if op == "!":
                value = _factorial(value)
            elif op == "_":
                sub = self.primary()
                bits, degree = value.bits + sub.bits, value.degree + sub.degree
                value = _Item(bits, variable=value.variable, polynomial=value.polynomial, degree=degree)
            else:
                value = _power(value, self.primary())
        return value

    def primary(self) -> _Item:
        if self.pos >= len(self.tokens):
            return _Item(0)
        kind, tok = self.tokens[self.pos]
        self.pos += 1
        if tok in _OPEN:
            return self.sequence()
        if kind == "num":
            return _number(tok)
        if tok in _FACTORIAL_LIKE:
            return _factorial(self.primary())
        if tok == "\\sqrt":
            if self.peek() == "[":
                self.primary()
            return _root(self.primary())
        if tok in _BINOMIAL:
            n, k = self.primary(), self.primary()
            bits = min(n.bits * max(k.magnitude(), 1.0), n.magnitude())
            variable, degree = n.variable or k.variable, n.degree + k.degree
            return _Item(bits, variable=variable, polynomial=n.polynomial, degree=degree)
        if kind in ("cmd", "letter"):
            return _Item(1, variable=kind == "letter")
        return _Item(0)


def _number(literal: str) -> _Item:
    if literal.isdigit() and len(literal) <= 30:
        return _Item(int(literal).bit_length(), integer=int(literal))
    mantissa, _, exponent = literal.lower().partition("e")
    digits = len(mantissa.replace(".", "").lstrip("0")) or 1
    scale = abs(int(exponent)) if exponent else 0
    return _Item((digits + scale) * math.log2(10) + 1)


def _root(radicand: _Item) -> _Item:
    if radicand.bits > MAX_ROOT_BITS:  # sympy's perfect-power search takes minutes
        raise TooLarge(f"a root of a value that could exceed {MAX_ROOT_BITS} bits")
    return _Item(radicand.bits, variable=radicand.variable, polynomial=radicand.polynomial, degree=radicand.degree)


def _power(base: _Item, exponent: _Item) -> _Item:
    if exponent.integer is None and not exponent.variable:
        _root(base)  # the exponent may be a fraction: a root
    magnitude = exponent.magnitude()
    degree, terms = base.degree, base.terms
    if base.polynomial:  # (a + b + ...)^n expands to at most C(n + t - 1, t - 1) terms
        degree = min(max(base.degree, 1.0) * magnitude, _CAP)
        n, t = int(min(magnitude, MAX_DEGREE + 1)), int(min(base.terms, MAX_TERMS + 1))
        terms = min(float(math.comb(n + t - 1, t - 1)), _CAP)
    bits = min(max(base.bits, 1.0) * magnitude, _CAP) + exponent.bits
    variable = base.variable or exponent.variable
    return _Item(bits, variable=variable, polynomial=base.polynomial, degree=degree, terms=terms)


def _factorial(arg: _Item) -> _Item:
    n = arg.magnitude()
    bits = min(n * math.log2(n + 2), _CAP)
    return _Item(bits, variable=arg.variable, polynomial=arg.polynomial, degree=arg.degree)


def check_size(text: str) -> None:
    """Raise ``TooLarge`` if the answer text could make sympy build a number beyond the bounds."""
    if len(text) > MAX_CHARS:
        raise TooLarge(f"it is longer than {MAX_CHARS} characters")
    reader = _Reader(text)
    while reader.pos < len(reader.tokens):  # stray closing brackets end a sequence early
        reader.sequence()
