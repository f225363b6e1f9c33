"""A Python tool: the model's code runs in the code verifier's sandbox, under its limits.

The code is the program (``main.py``, run by the sandbox's Python with ``-S -s -B``); what it
prints is the result. Nothing is judged from inside the sandbox: how the run ended is classified
outside it by ``verifiers.code.verdict.classify`` (the same order as the code verifier: output
cap, time, memory, then a non-zero exit or a signal) and becomes the result's ``status`` and
``detail``. A program that forks without end, loops, writes a huge file or prints without end is
cut by its limit, and its result says which.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from runtime.episodes.tools import Status, ToolResult
from verifiers.code.languages import LANGUAGES
from verifiers.code.limits import MIB, Limits
from verifiers.code.sandbox import Sandbox
from verifiers.code.verdict import classify
from verifiers.errors import SandboxUnavailable
from verifiers.outcome import Verdict

TOOL_LIMITS = Limits(wall_s=5.0, cpu_s=3.0, memory_bytes=256 * MIB, output_bytes=64 * 1024, processes=16,
                     file_bytes=8 * MIB, disk_bytes=32 * MIB)
"""A tool call's default limits: tighter than a verifier's (a call is one step of a rollout)."""

_STATUS = {Verdict.OLE: Status.OUTPUT_LIMIT, Verdict.TLE: Status.TIME_LIMIT, Verdict.MLE: Status.MEMORY_LIMIT}
MAX_CODE_BYTES = 64 * 1024


@dataclasses.dataclass(frozen=True)
class PythonTool:
    """Runs the call's code as a Python program in ``sandbox``.

    Attributes:
      sandbox: a ``verifiers.code.Sandbox`` (None: the process-wide code verifier's).
      limits: the limits of one call.
    """

    sandbox: Sandbox | None = None
    limits: Limits = TOOL_LIMITS
    name: str = "python"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "limits": dataclasses.asdict(self.limits)}

    def _sandbox(self) -> Sandbox:
        if self.sandbox is not None:
            return self.sandbox
        from verifiers.code.verify import default_verifier

        return default_verifier().sandbox

    def run(self, arguments: str) -> ToolResult:
        code = arguments.encode("utf-8", "replace")
        if len(code) > MAX_CODE_BYTES:
            return ToolResult.refused(Status.ERROR, f"code longer than {MAX_CODE_BYTES} bytes")
        language = LANGUAGES["python"]
        start = time.perf_counter()
        try:
            run = self._sandbox().run(language.run, files={language.source: code}, limits=self.limits)
        except SandboxUnavailable as e:
            return ToolResult.refused(Status.UNAVAILABLE, f"no sandbox: {e}")
        wall_s = run.wall_s if run.wall_s > 0 else time.perf_counter() - start
        output = run.stdout + run.stderr
        verdict = classify(run, self.limits)
        if verdict is None:
            return ToolResult.of(output, 0, wall_s, Status.OK)
        kind, detail = verdict
        status = _STATUS.get(kind, Status.ERROR)
        exit_status = run.exit_code if status is Status.ERROR else None
        return ToolResult.of(output, exit_status, wall_s, status, detail)
