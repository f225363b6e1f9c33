"""A Jinja sandbox whose work and memory per render are bounded, deterministically.

``jinja2.sandbox.ImmutableSandboxedEnvironment`` keeps a template away from Python's internals,
but not from the machine: nested ``range(100000)`` loops run for hours and ``'x' * 1500000000``
allocates gigabytes. ``BoundedEnvironment`` charges every render a budget, counted, never timed
(a render is refused or not by its template and messages alone, on any machine):

- operations (``MAX_OPERATIONS``): each loop iteration (the compiled ``for`` iterates through a
  counter; a recursive loop's inner calls too), call, attribute or item lookup, operator,
  comparison, filter and test, and each node of a value a filter measures;
- characters built (``MAX_BUILT_CHARS``): the length of every string a concatenation, an
  operator, a call, a filter or an output expression produces;
- the size of one value (``MAX_VALUE_CHARS``): checked *before* an operation that could build a
  larger one (``*`` and ``+`` of strings and lists, ``%`` and ``str.format`` with their widths,
  padding methods, ``replace``, ``join``, ``indent``, ``center``, ``batch``, ...), measuring
  nested values without rendering them;
- integers (``MAX_INT_BITS``) before ``*``, ``**`` and ``+``; macro and recursive-loop call depth
  (``MAX_CALL_DEPTH``).

``random`` and ``lipsum`` (randomness) and ``pprint`` are left out, so a render is deterministic.
Jinja's own limit on ``range`` (100,000 items) stays.
"""

from __future__ import annotations

import functools
import json
import re
import string
import threading
import typing as t
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from jinja2 import nodes
from jinja2.runtime import LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer

from runtime.errors import UsageError

MAX_OPERATIONS = 1 << 20  # a chat template does a few thousand for a conversation
MAX_BUILT_CHARS = 1 << 26  # 16 times the longest prompt
MAX_VALUE_CHARS = 1 << 22  # one string or list (the longest prompt: 4 Mi characters)
MAX_INT_BITS = 1 << 14
MAX_CALL_DEPTH = 32
MAX_FORMAT_WIDTH = 1 << 12
MAX_JSON_INDENT = 16
_LEFT_OUT = ("random", "pprint")
# The filters that show their whole value as text, or build from its parts or from their arguments
# (the rest only look at it): their value is measured, and their arguments checked, first.
_SHOWING = frozenset({
    "batch", "capitalize", "center", "e", "escape", "forceescape", "format", "indent", "join", "lower", "replace",
    "safe", "slice", "string", "striptags", "sum", "title", "tojson", "trim", "truncate", "upper", "urlencode",
    "urlize", "wordcount", "wordwrap", "xmlattr", "int", "float",
})


class TemplateError(UsageError):
    """A chat template that cannot be compiled or rendered; the message is one line."""


class _Budget:
    """What one render has spent (private to the thread that renders)."""

    def __init__(self) -> None:
        self.operations = 0
        self.chars = 0
        self.depth = 0

    def step(self, n: int = 1) -> None:
        self.operations += n
        if self.operations > MAX_OPERATIONS:
            raise TemplateError(f"the chat template did more than {MAX_OPERATIONS} operations (loop iterations, "
                                "calls, lookups, operators) for one prompt; a chat template does a few thousand")

    def build(self, n: int) -> None:
        self.chars += n
        if self.chars > MAX_BUILT_CHARS:
            raise TemplateError(f"the chat template built more than {MAX_BUILT_CHARS} characters for one prompt")


def _too_large(what: str, size: int, *, at_least: bool = False) -> TemplateError:
    return TemplateError(f"the chat template would build {what} of {'at least ' * at_least}{size} characters or "
                         f"items; at most {MAX_VALUE_CHARS} are accepted")


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _sequence(value: Any) -> bool:
    return isinstance(value, str | list | tuple)


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox with a budget per render (see the module docstring); ``compile_template``
    compiles a template with its ``for``, ``~`` and comparisons counted, ``rendering()`` gives a
    render its budget."""

    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options, finalize=self._finalize)
        self._local = threading.local()
        self.globals.pop("lipsum", None)
        for name in _LEFT_OUT:
            self.filters.pop(name, None)
        self.filters = {name: self._bounded_filter(name, f) for name, f in self.filters.items()}
        self.tests = {name: self._bounded_test(t.cast(Callable, f)) for name, f in self.tests.items()}
        self.rlx_iterate = self._iterate
        self.rlx_concat = self._concat
        self.rlx_compare = self._compare

    def add_filter(self, name: str, f: Callable) -> None:
        """Add (or replace) filter ``name``, bounded as the built-in ones."""
        self.filters[name] = self._bounded_filter(name, f)

    # -- the budget

    def rendering(self) -> _Rendering:
        """A context in which this thread renders (or compiles) with a fresh budget."""
        return _Rendering(self._local)

    @property
    def _budget(self) -> _Budget:
        budget = getattr(self._local, "budget", None)
        if budget is None:
            raise TemplateError("the chat template ran outside a bounded render")
        return budget

    def measure(self, value: Any, *, limit: int = MAX_VALUE_CHARS) -> int:
        """The characters and items of ``value`` as a string would show them, counted without
        building it (shared parts count each time they appear); refused above ``limit``."""
        budget, total, stack = self._budget, 0, [value]
        while stack:
            node = stack.pop()
            if isinstance(node, str):
                total += len(node)
            elif isinstance(node, Mapping):
                budget.step()
                total += 2 + len(node)
                stack.extend(node.keys())
                stack.extend(node.values())
            elif isinstance(node, list | tuple | set | frozenset):
                budget.step()
                total += 2 + len(node)
                stack.extend(node)
            elif isinstance(node, Namespace):
                stack.append(node._Namespace__attrs)
            elif _int(node):
                total += node.bit_length() // 3 + 1
            else:
                total += 1
            if total > limit:
                raise _too_large("a value", total, at_least=True)
        return total

    def _built(self, value: Any) -> Any:
        if isinstance(value, str):
            if len(value) > MAX_VALUE_CHARS:
                raise _too_large("a string", len(value))
            self._budget.build(len(value))
        elif isinstance(value, list | tuple):
            if len(value) > MAX_VALUE_CHARS:
                raise _too_large("a list", len(value))
            self._budget.step(len(value) // 16)
        elif _int(value) and value.bit_length() > MAX_INT_BITS:
            raise TemplateError(f"the chat template built an integer of {value.bit_length()} bits; at most "
                                f"{MAX_INT_BITS} are accepted")
        return value

    # -- the template: for, ~ and comparisons through counters

    def compile_template(self, source: str):
        """``source`` compiled with its loops, concatenations and comparisons counted."""
        with self.rendering():  # Jinja folds constant filters and tests while compiling
            tree = _Counted().visit(self.parse(source))
            return self.from_string(tree)

    def _iterate(self, iterable: Any) -> Iterator[Any]:
        budget = self._budget
        for item in iterable:
            budget.step()
            yield item

    def _concat(self, *parts: Any) -> str:
        for part in parts:
            self.measure(part)
        texts = [str(part) for part in parts]
        size = sum(map(len, texts))
        if size > MAX_VALUE_CHARS:
            raise _too_large("a string", size)
        return "".join(texts)

    def _compare(self, left: Any, *rest: Any) -> bool:
        for i in range(0, len(rest), 2):
            op, right = rest[i], rest[i + 1]
            for value in (left, right):
                if isinstance(value, str):
                    self._budget.build(len(value))
                elif isinstance(value, list | tuple | Mapping):
                    self._budget.step(len(value))
            if not _COMPARISONS[op](left, right):
                return False
            left = right
        return True

    # -- the sandbox's hooks

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        budget = __self._budget
        budget.step()
        args = __self._checked_call(__obj, args)
        nested = isinstance(__obj, Macro | LoopContext)
        if isinstance(__obj, LoopContext) and args:
            args = (__self._iterate(args[0]), *args[1:])
        if nested:
            budget.depth += 1
            if budget.depth > MAX_CALL_DEPTH:
                raise TemplateError(f"the chat template nests macro or recursive-loop calls more than "
                                    f"{MAX_CALL_DEPTH} deep (a macro that calls itself without end?)")
        try:
            result = super().call(__context, __obj, *args, **kwargs)
        finally:
            if nested:
                budget.depth -= 1
        return __self._built(result)

    def getattr(self, obj: Any, attribute: str) -> Any:
        self._budget.step()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        self._budget.step()
        value = super().getitem(obj, argument)
        return self._built(value) if isinstance(argument, slice) else value

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        self._budget.step()
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if _sequence(seq) and _int(times):
                    size = self.measure(seq) * max(times, 0)
                    if size > MAX_VALUE_CHARS:
                        raise _too_large(f"{type(seq).__name__} * {times}", size)
            if _int(left) and _int(right) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise TemplateError(f"the chat template multiplies integers past {MAX_INT_BITS} bits")
        elif operator == "+" and _sequence(left) and _sequence(right):
            size = self.measure(left) + self.measure(right)
            if size > MAX_VALUE_CHARS:
                raise _too_large("a concatenation", size)
        elif operator == "**" and _int(left) and _int(right) and right > 0 and abs(left) > 1:
            if right * left.bit_length() > MAX_INT_BITS:
                raise TemplateError(f"the chat template raises an integer to the power {right}, past "
                                    f"{MAX_INT_BITS} bits")
        elif operator == "%" and isinstance(left, str):
            _check_percent(self, left, right)
        return self._built(super().call_binop(context, operator, left, right))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        template, is_map = value.__self__, value.__name__ == "format_map"

        @functools.wraps(wrapped)
        def bounded(*args: Any, **kwargs: Any) -> str:
            _check_braces(self, template, args[0] if is_map and args else (args, kwargs))
            return wrapped(*args, **kwargs)

        return bounded

    def _finalize(self, value: Any) -> Any:
        size = len(value) if isinstance(value, str) else self.measure(value)
        self._budget.build(size)
        return value

    # -- calls, filters and tests with their amplifying arguments checked

    def _checked_call(self, obj: Any, args: tuple) -> tuple:
        owner = getattr(obj, "__self__", None)
        if not isinstance(owner, str):
            return args
        name = getattr(obj, "__name__", "")
        if name in ("center", "ljust", "rjust", "zfill") and args and _int(args[0]) and args[0] > MAX_VALUE_CHARS:
            raise _too_large(f"str.{name}({args[0]})", args[0])
        if name == "expandtabs":
            size = len(owner) + owner.count("\t") * (args[0] if args and _int(args[0]) else 8)
            if size > MAX_VALUE_CHARS:
                raise _too_large("str.expandtabs", size)
        if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
            _check_replace(owner, *args[:3])
        if name == "join" and args:
            items = list(self._iterate(args[0]))
            size = sum(self.measure(item) for item in items) + max(len(items) - 1, 0) * len(owner)
            if size > MAX_VALUE_CHARS:
                raise _too_large("str.join", size)
            return (items, *args[1:])
        if name in ("translate", "maketrans"):
            raise TemplateError(f"the chat template may not call str.{name}")
        return args

    def _bounded_filter(self, name: str, f: Callable) -> Callable:
        passes = getattr(f, "jinja_pass_arg", None) is not None

        @functools.wraps(f)
        def bounded(*args: Any, **kwargs: Any) -> Any:
            self._budget.step()
            first = 1 if passes else 0
            if len(args) > first and name in _SHOWING:
                value = args[first]
                if isinstance(value, Iterator):  # a generator (map, select, ...) measured as a list
                    value = list(self._iterate(value))
                    args = (*args[:first], value, *args[first + 1:])
                self.measure(value)
                _check_filter(self, name, value, args[first + 1:], kwargs)
            return self._built(f(*args, **kwargs))

        return bounded

    def _bounded_test(self, f: Callable) -> Callable:
        @functools.wraps(f)
        def bounded(*args: Any, **kwargs: Any) -> Any:
            budget = self._budget
            budget.step(1 + sum(len(a) for a in args if isinstance(a, list | tuple | Mapping)))
            budget.build(sum(len(a) for a in args if isinstance(a, str)))
            return f(*args, **kwargs)

        return bounded


class _Rendering:
    def __init__(self, local: threading.local) -> None:
        self._local = local

    def __enter__(self) -> None:
        self._local.budget = _Budget()

    def __exit__(self, *exc: Any) -> None:
        self._local.budget = None


_COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "gt": lambda a, b: a > b,
    "gteq": lambda a, b: a >= b, "lt": lambda a, b: a < b, "lteq": lambda a, b: a <= b,
    "in": lambda a, b: a in b, "notin": lambda a, b: a not in b,
}


def _call(name: str, args: list[nodes.Node], lineno: int) -> nodes.Call:
    call = nodes.Call(nodes.EnvironmentAttribute(name), args, [], None, None)
    call.set_lineno(lineno)
    return call


class _Counted(NodeTransformer):
    """Loops iterate through ``rlx_iterate``; ``~`` and comparisons are ``rlx_concat`` and
    ``rlx_compare`` calls (so the sandbox counts and bounds them)."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = _call("rlx_iterate", [node.iter], node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return _call("rlx_concat", list(node.nodes), node.lineno)

    def visit_Compare(self, node: nodes.Compare) -> nodes.Node:
        self.generic_visit(node)
        args: list[nodes.Node] = [node.expr]
        for operand in node.ops:
            args += [nodes.Const(operand.op, lineno=node.lineno), operand.expr]
        return _call("rlx_compare", args, node.lineno)


_PERCENT = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?([a-zA-Z%])")


def _check_widths(widths: list[str], where: str) -> None:
    for width in widths:
        if width == "*" or (width and int(width) > MAX_FORMAT_WIDTH):
            raise TemplateError(f"the chat template formats with the width {width!r} ({where}); widths up to "
                                f"{MAX_FORMAT_WIDTH} are accepted")


def _check_percent(env: BoundedEnvironment, template: str, args: Any) -> None:
    specs = _PERCENT.findall(template)
    _check_widths([w for spec in specs for w in spec[:2]], "%")
    size = len(template) + len(specs) * (env.measure(args) + MAX_FORMAT_WIDTH)
    if size > MAX_VALUE_CHARS:
        raise _too_large("a %-formatted string", size)


def _check_braces(env: BoundedEnvironment, template: str, args: Any) -> None:
    fields = [spec for _, field, spec, _ in string.Formatter().parse(template) if field is not None]
    if any("{" in (spec or "") for spec in fields):
        raise TemplateError("the chat template formats with a nested replacement field in a format spec")
    _check_widths([w for spec in fields for w in re.findall(r"\d+", spec or "")], "str.format")
    size = len(template) + len(fields) * (env.measure(args) + MAX_FORMAT_WIDTH)
    if size > MAX_VALUE_CHARS:
        raise _too_large("a formatted string", size)


def _check_replace(text: str, old: str, new: str, count: Any = -1) -> None:
    found = text.count(old) if old else len(text) + 1
    if _int(count) and count >= 0:
        found = min(found, count)
    size = len(text) + found * (len(new) - len(old))
    if size > MAX_VALUE_CHARS:
        raise _too_large("a replace", size)


def _argument(args: tuple, kwargs: Mapping[str, Any], index: int, name: str, default: Any) -> Any:
    return args[index] if len(args) > index else kwargs.get(name, default)


def _check_filter(env: BoundedEnvironment, name: str, value: Any, args: tuple, kwargs: Mapping[str, Any]) -> None:
    """Refuse a filter call whose arguments would build a value past the bounds."""
    text = value if isinstance(value, str) else None
    if name == "center":
        width = _argument(args, kwargs, 0, "width", 80)
        if _int(width) and width > MAX_VALUE_CHARS:
            raise _too_large(f"center({width})", width)
    elif name == "indent":
        width = _argument(args, kwargs, 0, "width", 4)
        size = width if _int(width) else env.measure(width)
        shown = str(value) if text is None else text
        total = len(shown) + (shown.count("\n") + 1) * max(size, 0)
        if total > MAX_VALUE_CHARS:
            raise _too_large("an indent", total)
    elif name == "wordwrap":
        wrap = _argument(args, kwargs, 2, "wrapstring", "\n")
        if text is not None and isinstance(wrap, str) and len(text) * (1 + len(wrap)) > MAX_VALUE_CHARS:
            raise _too_large("a wordwrap", len(text) * (1 + len(wrap)))
    elif name in ("batch", "slice"):
        count = _argument(args, kwargs, 0, "linecount" if name == "batch" else "slices", 1)
        if _int(count) and count > MAX_VALUE_CHARS:
            raise _too_large(f"{name}({count})", count)
    elif name == "replace" and text is not None:
        old, new = _argument(args, kwargs, 0, "old", ""), _argument(args, kwargs, 1, "new", "")
        if isinstance(old, str) and isinstance(new, str):
            _check_replace(text, old, new, _argument(args, kwargs, 2, "count", -1))
    elif name == "join":
        separator = _argument(args, kwargs, 0, "d", "")
        items = len(value) if hasattr(value, "__len__") else 0
        size = env.measure(value) + max(items - 1, 0) * env.measure(separator)
        if size > MAX_VALUE_CHARS:
            raise _too_large("a join", size)
    elif name == "format" and text is not None:
        _check_percent(env, text, (args, kwargs))
    elif name == "sum":
        start = _argument(args, kwargs, 1, "start", 0)
        if not isinstance(start, int | float):
            raise TemplateError(f"the chat template sums with the start {type(start).__name__}; sum adds numbers")
    elif name == "tojson":
        indent = _argument(args, kwargs, 1, "indent", None)
        separators = _argument(args, kwargs, 2, "separators", None) or ()
        if ((indent is not None and env.measure(indent) > MAX_JSON_INDENT)
                or (_int(indent) and indent > MAX_JSON_INDENT) or env.measure(separators) > 2 * MAX_JSON_INDENT):
            raise TemplateError(f"the chat template's tojson indents or separates by more than {MAX_JSON_INDENT} "
                                "characters")


def bounded_json(value: Any, **options: Any) -> str:
    """``json.dumps(value, **options)``, refused as soon as it passes ``MAX_VALUE_CHARS``."""
    chunks, size = [], 0
    for chunk in json.JSONEncoder(**options).iterencode(value):
        size += len(chunk)
        if size > MAX_VALUE_CHARS:
            raise _too_large("tojson", size)
        chunks.append(chunk)
    return "".join(chunks)


__all__ = ["BoundedEnvironment", "TemplateError", "bounded_json"]
