"""The config reference: every section and field of :mod:`runtime.config`, with its type, default
and description, read from the declarations themselves.

A field's description is the attribute docstring right below it (a string statement after the
annotated assignment, as Sphinx and PEP 257 read them); its type is the annotation as written and
its default the dataclass default. :func:`reference` renders them as Markdown, the text of
``configs/REFERENCE.md`` (``rlx config reference``); a test keeps that file equal to it and every
field described, so the reference cannot drift from the code.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import textwrap
from typing import Any

from runtime.config import SECTIONS, Section

HEADER = """\
# rlx config reference

Every section and field a run config (a TOML file, or `--set SECTION.FIELD=VALUE`) accepts, with
its type, its default and what it does. Generated from the declarations in `runtime/config.py` by
`rlx config reference`; do not edit it by hand. Fields described as *filled in* are set by
`rlx run` when the run starts and recorded in the ledger; a config leaves them unset.
"""


def field_docs(cls: type[Section]) -> dict[str, str]:
    """Each field of section ``cls`` that has an attribute docstring, with that text (one line)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for statement, after in zip(body, body[1:], strict=False):
        if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[statement.target.id] = " ".join(after.value.value.split())
    return docs


def field_types(cls: type[Section]) -> dict[str, str]:
    """Each field of section ``cls`` with its annotation as written."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    return {s.target.id: ast.unparse(s.annotation) for s in tree.body[0].body  # type: ignore[attr-defined]
            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}


def default_of(field: dataclasses.Field) -> Any:
    """A field's default value (a factory's product for a mutable default)."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def toml_value(value: Any) -> str:
    """``value`` as a TOML file writes it; None, which TOML cannot write, as ``unset``."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def undescribed() -> list[str]:
    """``section.field`` of every field without a description (none, in a consistent tree)."""
    return [f"{name}.{f.name}" for name, cls in SECTIONS.items() for f in dataclasses.fields(cls)
            if not field_docs(cls).get(f.name)]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def reference() -> str:
    """The Markdown reference of every section and field, in the order ``Config`` declares them."""
    out = [HEADER]
    for name, cls in SECTIONS.items():
        docs, types = field_docs(cls), field_types(cls)
        out.append(f"## `[{name}]`\n")
        out.append(inspect.cleandoc(cls.__doc__ or "") + "\n")
        out.append("| field | type | default | description |")
        out.append("|---|---|---|---|")
        for f in dataclasses.fields(cls):
            out.append(f"| `{f.name}` | `{_cell(types[f.name])}` | `{_cell(toml_value(default_of(f)))}` "
                       f"| {_cell(docs.get(f.name, ''))} |")
        out.append("")
    return "\n".join(out)


__all__ = ["default_of", "field_docs", "reference", "toml_value", "undescribed"]
