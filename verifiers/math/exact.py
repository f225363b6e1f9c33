"""Exact values of constant answers: numbers, fractions and simple closed forms.

A small recursive-descent parser turns answer text such as ``-3``, ``0.25``, ``1e-7``,
``\\frac{3}{4}``, ``1/2004!``, ``2^{-99}``, ``4\\sqrt{2}`` or ``\\frac{\\pi}{3}`` into an exact
sympy value. Nothing is rounded: ``1e-7`` is the rational ``1/10^7``. Text outside the grammar
(variables, sets, intervals, functions) yields ``None`` and is left to the symbolic path.

Grammar (``implicit`` is juxtaposition such as ``2\\pi`` or ``3(4)``, never two bare numbers)::

    expr    := term (("+" | "-") term)*
    term    := unary (("*" | "/" | "\\cdot" | "\\times" | "\\div" | implicit) unary)*
    unary   := ("-" | "+") unary | power
    power   := postfix ("^" (group | unary))?
    postfix := atom "!"*
    atom    := number | "(" expr ")" | "{" expr "}" | "\\frac" group group
             | "\\sqrt" ("[" expr "]")? group | "\\pi" | "pi" | "sqrt" group
    group   := "{" expr "}" | "(" expr ")" | digit | "\\pi"

Work is bounded before it is done, so hostile text such as ``(10^{10000})^{10000}`` or
``((10!)!)!`` is refused at once instead of computed: every number in the text, every power and
every factorial has its size estimated from its operands first (``MAX_BITS`` bits at most, an
exponent at most ``MAX_EXPONENT``, a factorial at most ``MAX_FACTORIAL!``, an inexact root only
of a value up to ``MAX_ROOT_BITS`` bits: sympy's perfect-power search on a large radicand takes
minutes), nesting is at most
``MAX_NESTING`` deep and the text at most ``MAX_CHARS`` long. Text beyond a bound raises
``TooLarge`` from ``evaluate``; ``parse_constant`` maps it to ``None``.
"""

from __future__ import annotations

import re

import sympy

MAX_EXPONENT = 10_000
MAX_FACTORIAL = 5_000
MAX_BITS = 200_000
MAX_NESTING = 40
MAX_ROOT_BITS = 1_000
MAX_CHARS = 2_000

_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)"
    r"|(?P<cmd>\\[a-zA-Z]+)|(?P<word>[a-zA-Z]+)|(?P<op>[-+*/^!(){}\[\]]))"
)
_MUL_CMDS = {"\\cdot", "\\times"}
_ATOM_STARTS = {"(", "{", "\\frac", "\\sqrt", "\\pi", "pi", "sqrt"}


class _Reject(Exception):
    """The text is outside the grammar."""


class TooLarge(Exception):
    """The text is in the grammar but its value (or the work to get it) is beyond the bounds."""


def size_bits(value: sympy.Expr) -> int:
    """An estimate of the bits needed to hold ``value``: exact for a rational, else the bits of
    every rational inside it added up (``pi`` and ``sqrt(2)`` are a few bits)."""
    if value.is_Rational:
        return max(int(value.p).bit_length(), int(value.q).bit_length())
    return sum(size_bits(r) for r in value.atoms(sympy.Rational)) + 1


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise _Reject(text[pos:])
        pos = m.end()
        kind = m.lastgroup
        assert kind is not None
        tokens.append((kind, m.group(kind)))
    return tokens


def _number(literal: str) -> sympy.Rational:
    mantissa, _, exponent = literal.lower().partition("e")
    whole, _, frac = mantissa.partition(".")
    if exponent and abs(int(exponent)) > MAX_EXPONENT:  # the digits are few (MAX_CHARS)
        raise TooLarge(f"the number {literal} has an exponent beyond {MAX_EXPONENT}")
    value = sympy.Rational(int((whole or "0") + frac), 10 ** len(frac))
    if exponent:
        value *= sympy.Rational(10) ** int(exponent)
    return value


def _check_size(value: sympy.Expr) -> sympy.Expr:
    if size_bits(value) > MAX_BITS:
        raise TooLarge(f"a value needs more than {MAX_BITS} bits")
    if not value.is_Rational and value.has(sympy.zoo, sympy.nan, sympy.oo):
        raise _Reject("undefined")
    return value


def _power(base: sympy.Expr, exponent: sympy.Rational) -> sympy.Expr:
    """``base ** exponent`` once its cost is known to be small."""
    # (10^{10000})^{10000} would need 3e8 bits: refused before it is computed
    if size_bits(base) * abs(int(exponent.p)) > MAX_BITS:
        raise TooLarge(f"a power needs more than {MAX_BITS} bits")
    if exponent.q > 1 and size_bits(base) > MAX_ROOT_BITS:
        # sympy looks for perfect powers in a root's radicand, slowly for a large one: take
        # exact roots here and refuse the rest
        if not base.is_Rational:
            raise TooLarge(f"a root of a value beyond {MAX_ROOT_BITS} bits")
        p, p_exact = sympy.integer_nthroot(abs(int(base.p)), int(exponent.q))
        q, q_exact = sympy.integer_nthroot(int(base.q), int(exponent.q))
        if not (p_exact and q_exact) or base < 0:
            raise TooLarge(f"an inexact root of a number beyond {MAX_ROOT_BITS} bits")
        root = sympy.Rational(p if base > 0 else -p, q)
        return _check_size(root ** exponent.p)
    return _check_size(base**exponent)


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]):
        self.tokens = tokens
        self.pos = 0
        self.depth = 0

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise TooLarge(f"the expression nests deeper than {MAX_NESTING}")

    def peek(self) -> str | None:
        return self.tokens[self.pos][1] if self.pos < len(self.tokens) else None

    def peek_kind(self) -> str | None:
        return self.tokens[self.pos][0] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            raise _Reject(f"expected {expected!r}, got {tok!r}")
        self.pos += 1
        return tok

    def expr(self) -> sympy.Expr:
        self.enter()
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.term()
            value = _check_size(value + rhs if op == "+" else value - rhs)
        self.depth -= 1
        return value

    def term(self) -> sympy.Expr:
        value = self.unary()
        while True:
            tok = self.peek()
            if tok in ("*", "/", "\\div") or tok in _MUL_CMDS:
                self.take()
                rhs = self.unary()
                if tok in ("/", "\\div"):
                    if rhs == 0:
                        raise _Reject("division by zero")
                    value = value / rhs
                else:
                    value = value * rhs
            elif tok in _ATOM_STARTS:  # implicit multiplication: 2\pi, 4\sqrt{2}, 3(4)
                value = value * self.unary()
            else:
                return value
            value = _check_size(value)

    def unary(self) -> sympy.Expr:
        tok = self.peek()
        if tok not in ("-", "+"):
            return self.power()
        self.take()
        self.enter()
        value = self.unary()
        self.depth -= 1
        return -value if tok == "-" else value

    def power(self) -> sympy.Expr:
        base = self.postfix()
        if self.peek() != "^":
            return base
        self.take()
        exponent = self.group() if self.peek() in ("{", "(") else self.unary()
        if not exponent.is_Rational or exponent.q > 1000:
            raise _Reject("exponent not a small rational")
        if abs(exponent.p) > MAX_EXPONENT * exponent.q:
            raise TooLarge(f"an exponent beyond {MAX_EXPONENT}")
        if base == 0 and exponent <= 0:
            raise _Reject("zero to a non-positive power")
        return _power(base, exponent)

    def postfix(self) -> sympy.Expr:
        value = self.atom()
        while self.peek() == "!":
            self.take()
            if not value.is_Integer or value < 0:
                raise _Reject("factorial of a non-integer")
            if value > MAX_FACTORIAL:  # estimated before computing: ((10!)!)! is refused here
                raise TooLarge(f"a factorial beyond {MAX_FACTORIAL}!")
            value = sympy.factorial(value)
        return value

    def group(self) -> sympy.Expr:
        tok = self.peek()
        if tok == "{":
            self.take()
            value = self.expr()
            self.take("}")
            return value
        if tok == "(":
            self.take()
            value = self.expr()
            self.take(")")
            return value
        if self.peek_kind() == "num":  # \frac12 means \frac{1}{2}: one digit per argument
            literal = self.take()
            if not literal.isdigit():
                raise _Reject(literal)
            if len(literal) > 1:
                # keep the other digits as the next token: \frac12 -> {1}{2}
                self.tokens[self.pos - 1 : self.pos] = [("num", literal[0]), ("num", literal[1:])]
            return sympy.Integer(int(literal[0]))
        if tok == "\\pi":
            self.take()
            return sympy.pi
        raise _Reject(f"expected a group, got {tok!r}")

    def atom(self) -> sympy.Expr:
        kind, tok = self.peek_kind(), self.peek()
        if tok is None:
            raise _Reject("unexpected end")
        if kind == "num":
            self.take()
            if self.peek_kind() == "num":
                raise _Reject("two numbers side by side")
            return _check_size(_number(tok))
        if tok in ("(", "{"):
            return self.group()
        if tok == "\\frac":
            self.take()
            num = self.group()
            den = self.group()
            if den == 0:
                raise _Reject("division by zero")
            return num / den
        if tok in ("\\sqrt", "sqrt"):
            self.take()
            index = sympy.Integer(2)
            if tok == "\\sqrt" and self.peek() == "[":
                self.take()
                index = self.expr()
                self.take("]")
                if not index.is_Integer or not 2 <= int(index) <= 1000:
                    raise _Reject("root index")
            radicand = self.group()
            return _power(radicand, 1 / index)
        if tok in ("\\pi", "pi"):
            self.take()
            return sympy.pi
        raise _Reject(f"unexpected {tok!r}")


def evaluate(text: str) -> sympy.Expr | None:
    """The exact value of a constant answer, or None if the text is outside the grammar.

    Raises ``TooLarge`` (before doing the work) when the text or its value is beyond the bounds.
    The text should already be normalised (``extract.normalize``).
    """
    if len(text) > MAX_CHARS:
        raise TooLarge(f"it is longer than {MAX_CHARS} characters")
    try:
        tokens = _tokenize(text)
        if not tokens:
            return None
        parser = _Parser(tokens)
        value = parser.expr()
        if parser.pos != len(parser.tokens):
            return None
        if not value.is_number or value.has(sympy.zoo, sympy.nan, sympy.oo, sympy.I):
            return None
        return value
    except (_Reject, ValueError, ZeroDivisionError, OverflowError):
        return None


def parse_constant(text: str) -> sympy.Expr | None:
    """Like ``evaluate``, with text beyond the bounds also giving None."""
    try:
        return evaluate(text)
    except TooLarge:
        return None
