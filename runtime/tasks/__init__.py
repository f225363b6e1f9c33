"""Built-in tasks (arithmetic, program synthesis), users' JSONL data and reasoning-gym datasets."""

from __future__ import annotations

from runtime.errors import UsageError
from runtime.tasks.arithmetic import Arithmetic
from runtime.tasks.base import Problem, Task
from runtime.tasks.codefn import CodeFunctions
from runtime.tasks.gym import GymTask
from runtime.tasks.jsonl import JsonlTask, load_problems

TASKS: dict[str, type[Task]] = {"arithmetic": Arithmetic, "codefn": CodeFunctions, "jsonl": JsonlTask}
FAMILIES: dict[str, type[GymTask]] = {"gym": GymTask}
"""Tasks named ``family:member``: ``gym:chain_sum`` is ``GymTask("chain_sum", ...)``."""


def task_class(name: str) -> type[Task] | None:
    """The class of the task named ``name`` (a ``TASKS`` name or ``family:member``), or None."""
    family, sep, member = name.partition(":")
    if sep:
        return FAMILIES.get(family) if member else None
    return TASKS.get(name)


def make_task(name: str, **params) -> Task:
    """The task ``name`` built with ``params`` (one-line error for unknown names or parameters)."""
    cls = task_class(name)
    if cls is None:
        families = ", ".join(f"{f}:<name>" for f in FAMILIES)
        raise UsageError(f"unknown task {name!r}; accepted: {', '.join(TASKS)}, {families} (a reasoning-gym dataset)")
    family, sep, member = name.partition(":")
    try:
        return FAMILIES[family](member, **params) if sep else cls(**params)
    except TypeError as e:
        raise UsageError(f"bad parameters for task {name!r}: {e}") from None


__all__ = ["Arithmetic", "CodeFunctions", "FAMILIES", "GymTask", "JsonlTask", "Problem", "TASKS", "Task",
           "load_problems", "make_task", "task_class"]
