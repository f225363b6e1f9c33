"""What a tool call produced, and what a tool is: the record a replay returns instead of the tool.

A ``ToolResult`` is a measurement, not a decision: the bytes the tool wrote (cut to
``MAX_RESULT_BYTES`` for the model, ``truncated`` says so), its exit status (None: killed by a
limit or a signal), the wall time it took, and a ``status`` naming how it ended. Two results of
the same call are equal when everything but the wall time is (the wall time is kept for audit but
excluded from equality, as ``verifiers.outcome`` keeps its timings): that is what a replay and
``check_tools`` compare, because time is never reproducible.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Protocol

MAX_RESULT_BYTES = 1024
"""Bytes of a tool's output the model is shown (and recorded); the rest is cut, ``truncated`` set."""


class Status(str, enum.Enum):
    """How one tool call ended."""

    OK = "ok"  # ran and exited 0
    ERROR = "error"  # ran and failed: a bad expression, a non-zero exit, a signal
    TIME_LIMIT = "time_limit"  # cut by its wall or CPU limit
    MEMORY_LIMIT = "memory_limit"  # cut by its memory limit
    OUTPUT_LIMIT = "output_limit"  # cut by its output limit
    MALFORMED = "malformed"  # the call could not be parsed: no tool ran
    UNKNOWN_TOOL = "unknown_tool"  # the call names no tool of the environment: none ran
    UNAVAILABLE = "unavailable"  # the tool could not run here (no sandbox): recorded, not raised


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """What one tool call produced.

    Attributes:
      output: the bytes the tool wrote (stdout then stderr for a program), at most
        ``MAX_RESULT_BYTES``.
      exit_status: the exit status (0 ok); None when it ended by a limit or a signal, or never ran.
      wall_s: wall-clock seconds it took: a measurement, excluded from equality.
      truncated: the output was longer than what is kept.
      status: how it ended.
      detail: one line saying why, when it did not end ``ok`` (the limit that cut it, the error).
    """

    output: bytes
    exit_status: int | None
    wall_s: float = dataclasses.field(compare=False)
    truncated: bool
    status: Status
    detail: str = ""

    @classmethod
    def of(cls, output: bytes, exit_status: int | None, wall_s: float, status: Status, detail: str = "",
           *, limit: int = MAX_RESULT_BYTES) -> ToolResult:
        """A result with ``output`` cut to ``limit`` bytes (``truncated`` set when it was cut)."""
        return cls(bytes(output[:limit]), exit_status, float(wall_s), len(output) > limit, Status(status), detail)

    @classmethod
    def refused(cls, status: Status, detail: str) -> ToolResult:
        """A call that ran no tool (malformed, unknown tool, unavailable)."""
        return cls(b"", None, 0.0, False, Status(status), detail)

    def differences(self, other: ToolResult) -> list[str]:
        """The fields (other than the wall time) in which ``other`` differs from this result."""
        return [f.name for f in dataclasses.fields(self)
                if f.name != "wall_s" and getattr(self, f.name) != getattr(other, f.name)]

    def text(self) -> str:
        """What the model is shown: the output, with a line naming the limit or error if any."""
        body = self.output.decode("utf-8", "replace")
        if self.truncated:
            body += "\n...(output truncated)"
        if self.status is not Status.OK:
            body = (body.rstrip("\n") + "\n" if body else "") + f"error: {self.detail or self.status.value}"
        return body

    def to_dict(self) -> dict[str, Any]:
        return {"output": self.output, "exit_status": self.exit_status, "wall_s": self.wall_s,
                "truncated": self.truncated, "status": self.status.value, "detail": self.detail}


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One tool call of an episode as recorded: what was asked and what came back.

    Attributes:
      tool: the tool name as the model wrote it ("" for a malformed call).
      arguments: the argument text as the model wrote it.
      result: what the call produced (a malformed or unknown call has a ``refused`` result).
    """

    tool: str
    arguments: str
    result: ToolResult


class Tool(Protocol):
    """A tool the model may call: a name, a pure description of its limits, and ``run``.

    ``run`` never raises for anything the arguments contain: a bad argument, a limit hit or a
    crash is a ``ToolResult`` saying so.
    """

    @property
    def name(self) -> str: ...

    def run(self, arguments: str) -> ToolResult: ...

    def describe(self) -> dict[str, Any]:
        """The tool's name and limits (recorded with the episode's rule)."""
        ...
