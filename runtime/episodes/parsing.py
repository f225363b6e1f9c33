"""Tool-call rules: how a call is read from the text of the model's action.

A rule is pure and has a stable ``name`` and a ``digest`` (sha256 of its canonical description),
which the ledger will record so that a replay knows it reads calls the same way. A rule reads the
decoded text of the action's sampled ids (the ids themselves are never re-encoded) and says one
of three things: no call (the action is the final answer), a call (tool name and argument text),
or a malformed call (with the reason). A malformed call is an outcome the episode records, never
an exception.

- ``tag``: ``<tool>NAME: ARGUMENTS</tool>``, the first one in the action; an opening tag without
  its closing tag, or a name that is not ``[a-z_][a-z0-9_]*``, is malformed.
- ``fence``: a fenced Markdown block ````` ```python ... ``` ````` is a call of the ``python``
  tool with the block's code; an unclosed fence is malformed. (The built-in character model's
  alphabet has no backtick: it calls Python with ``<tool>python: CODE</tool>``.)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from typing import Any, Protocol

from runtime.errors import UsageError

_NAME = re.compile(r"[a-z_][a-z0-9_]*\Z")


@dataclasses.dataclass(frozen=True)
class Parsed:
    """What a rule read from one action.

    Attributes:
      call: whether the action makes a tool call (False: it is the final answer).
      tool: the tool's name ("" when malformed or no call).
      arguments: the argument text.
      malformed: why the call could not be read ("" when it could).
    """

    call: bool
    tool: str = ""
    arguments: str = ""
    malformed: str = ""


NO_CALL = Parsed(call=False)


class Rule(Protocol):
    @property
    def name(self) -> str: ...

    def describe(self) -> dict[str, Any]: ...

    def parse(self, text: str) -> Parsed: ...

    def syntax(self, tool: str, example: str) -> str:
        """How the model writes a call of ``tool`` with ``example`` arguments (for prompts)."""
        ...


def rule_digest(rule: Rule) -> str:
    """sha256 (hex) of the rule's canonical description."""
    return hashlib.sha256(json.dumps(rule.describe(), sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class TagRule:
    """``<tool>NAME: ARGUMENTS</tool>`` (tags configurable)."""

    open: str = "<tool>"
    close: str = "</tool>"
    name: str = "tag"
    version: int = 1

    def __post_init__(self) -> None:
        if not self.open or not self.close or self.open == self.close:
            raise UsageError(f"tool call tags {self.open!r} and {self.close!r} must be two different non-empty strings")

    def describe(self) -> dict[str, Any]:
        return {"rule": self.name, "version": self.version, "open": self.open, "close": self.close,
                "grammar": "first OPEN NAME ':' ARGUMENTS CLOSE; NAME [a-z_][a-z0-9_]*; ARGUMENTS stripped"}

    @property
    def digest(self) -> str:
        return rule_digest(self)

    def syntax(self, tool: str, example: str) -> str:
        return f"{self.open}{tool}: {example}{self.close}"

    def parse(self, text: str) -> Parsed:
        start = text.find(self.open)
        if start < 0:
            return NO_CALL
        body_start = start + len(self.open)
        end = text.find(self.close, body_start)
        if end < 0:
            return Parsed(call=True, malformed=f"{self.open} without {self.close}")
        name, colon, arguments = text[body_start:end].partition(":")
        name = name.strip()
        if not colon:
            return Parsed(call=True, malformed=f"no ':' after the tool name in {self.open}...{self.close}")
        if not _NAME.match(name):
            return Parsed(call=True, malformed=f"tool name {name[:40]!r} is not [a-z_][a-z0-9_]*")
        return Parsed(call=True, tool=name, arguments=arguments.strip())


@dataclasses.dataclass(frozen=True)
class FenceRule:
    """A fenced ````` ```python ````` block is a call of the ``python`` tool with its code."""

    language: str = "python"
    tool: str = "python"
    name: str = "fence"
    version: int = 1

    def describe(self) -> dict[str, Any]:
        return {"rule": self.name, "version": self.version, "language": self.language, "tool": self.tool,
                "grammar": "first '```' LANGUAGE newline CODE '```'"}

    @property
    def digest(self) -> str:
        return rule_digest(self)

    def syntax(self, tool: str, example: str) -> str:
        return f"```{self.language}\n{example}\n```"

    def parse(self, text: str) -> Parsed:
        opening = f"```{self.language}\n"
        start = text.find(opening)
        if start < 0:
            return NO_CALL
        body_start = start + len(opening)
        end = text.find("```", body_start)
        if end < 0:
            return Parsed(call=True, malformed=f"```{self.language} block without its closing ```")
        return Parsed(call=True, tool=self.tool, arguments=text[body_start:end])


RULES: dict[str, Rule] = {"tag": TagRule(), "fence": FenceRule()}


def make_rule(name: str) -> Rule:
    """The rule registered as ``name`` (one-line error naming the accepted ones)."""
    rule = RULES.get(name)
    if rule is None:
        raise UsageError(f"unknown tool call rule {name!r}; accepted: {', '.join(RULES)}")
    return rule
