"""Built-in tasks (arithmetic, program synthesis) and users' JSONL data."""

from __future__ import annotations

from runtime.errors import UsageError
from runtime.tasks.arithmetic import Arithmetic
from runtime.tasks.base import Problem, Task
from runtime.tasks.codefn import CodeFunctions
from runtime.tasks.jsonl import JsonlTask, load_problems

TASKS = {"arithmetic": Arithmetic, "codefn": CodeFunctions, "jsonl": JsonlTask}


def make_task(name: str, **params) -> Task:
    """The task ``name`` built with ``params`` (one-line error for unknown names or parameters)."""
    cls = TASKS.get(name)
    if cls is None:
        raise UsageError(f"unknown task {name!r}; accepted: {', '.join(TASKS)}")
    try:
        return cls(**params)
    except TypeError as e:
        raise UsageError(f"bad parameters for task {name!r}: {e}") from None


__all__ = ["Arithmetic", "CodeFunctions", "JsonlTask", "Problem", "TASKS", "Task", "load_problems", "make_task"]
