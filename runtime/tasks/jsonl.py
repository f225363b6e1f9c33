"""Users' own data: a JSONL file of ``{"prompt", "answer"}`` or ``{"prompt", "tests"}`` rows.

``answer`` rows are checked by the math verifier; ``tests`` rows (a list of
``{"input": ..., "output": ...}`` stdin/stdout pairs) run the completion as a Python program in
the code sandbox. An optional ``"target"`` gives the supervised warm-start completion (default:
the answer). A deterministic ``eval_fraction`` of the rows (chosen by the seed) is held out.
Malformed rows are rejected up front, naming the file, line and problem.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np

from runtime.errors import UsageError
from runtime.tasks.base import Problem, Task, split_indices
from verifiers.outcome import Outcome


def _row_problem(path: str, line_no: int, row: object) -> Problem:
    where = f"{path}:{line_no}"
    if not isinstance(row, dict):
        raise UsageError(f"{where}: each line must be a JSON object, got {type(row).__name__}")
    unknown = sorted(set(row) - {"prompt", "answer", "tests", "target"})
    if "calls" in row:
        raise UsageError(f"{where}: 'calls' rows are function tests of the codefn task; read this file with "
                         '--set data.task=codefn (data.path names it)')
    if unknown:
        raise UsageError(f"{where}: unknown keys {unknown}; accepted: prompt, answer, tests, target")
    prompt = row.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise UsageError(f"{where}: 'prompt' must be a non-empty string, got {prompt!r}")
    has_answer, has_tests = "answer" in row, "tests" in row
    if has_answer == has_tests:
        raise UsageError(f"{where}: give exactly one of 'answer' (math) or 'tests' (code)")
    target = row.get("target")
    if target is not None and not isinstance(target, str):
        raise UsageError(f"{where}: 'target' must be a string, got {target!r}")
    if has_answer:
        answer = row["answer"]
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)
        if not isinstance(answer, str) or not answer:
            raise UsageError(f"{where}: 'answer' must be a non-empty string or a number, got {answer!r}")
        return Problem(prompt=prompt, answer=answer, target=target if target is not None else answer)
    tests = row["tests"]
    if not isinstance(tests, list) or not tests:
        raise UsageError(f"{where}: 'tests' must be a non-empty list of {{\"input\", \"output\"}} objects")
    pairs = []
    for k, t in enumerate(tests):
        if not (isinstance(t, dict) and set(t) == {"input", "output"}
                and isinstance(t["input"], str) and isinstance(t["output"], str)):
            raise UsageError(f"{where}: tests[{k}] must be {{\"input\": str, \"output\": str}}, got {t!r}")
        pairs.append((t["input"], t["output"]))
    return Problem(prompt=prompt, tests=tuple(pairs), target=target)


def load_problems(path: str) -> list[Problem]:
    """Every row of a JSONL file as a ``Problem``; one clear error for the first bad row."""
    if not os.path.isfile(path):
        raise UsageError(f"data file {path!r} does not exist (expected a JSONL file)")
    problems = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise UsageError(f"{path}:{line_no}: not valid JSON ({e.msg} at column {e.colno})") from None
            problems.append(_row_problem(path, line_no, row))
    if len(problems) < 2:
        raise UsageError(f"data file {path!r} has {len(problems)} rows; need at least 2 (train and eval)")
    return problems


def read_rows(path: str) -> list[object]:
    """The file's rows as parsed JSON, one per non-blank line (the rows :func:`load_problems`
    numbers), for tools that copy rows verbatim."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


class JsonlTask(Task):
    """Problems from a JSONL file, split into train and held-out eval by the seed."""

    name = "jsonl"
    reads_path = True

    def __init__(self, path: str, eval_fraction: float = 0.1, seed: int = 0):
        if not 0.0 < eval_fraction < 1.0:
            raise UsageError(f"eval_fraction must be in (0, 1), got {eval_fraction!r}")
        self.path = os.path.abspath(path)
        self.eval_fraction, self.seed = eval_fraction, seed
        rows = load_problems(self.path)
        n_eval = max(1, min(len(rows) - 1, round(len(rows) * eval_fraction)))
        held = set(split_indices(len(rows), n_eval, seed).tolist())
        self._train_rows = [i for i in range(len(rows)) if i not in held]
        self._train = [rows[i] for i in self._train_rows]
        self._eval = [p for i, p in enumerate(rows) if i in held]

    @property
    def train_size(self) -> int:
        return len(self._train)

    @property
    def eval_size(self) -> int:
        return len(self._eval)

    def max_prompt_chars(self) -> int:
        return max(len(p.prompt) for p in self._train + self._eval)

    def describe(self) -> dict:
        return {"name": self.name, "path": self.path, "eval_fraction": self.eval_fraction, "seed": self.seed}

    def problem(self, split: str, index: int) -> Problem:
        if split == "train":
            return self._train[index]
        if split == "eval":
            return self._eval[index]
        raise ValueError(f"unknown split {split!r}; accepted: train, eval")

    def train_row(self, index: int) -> int:
        """The position among the file's rows (see :func:`read_rows`) of training problem ``index``."""
        return self._train_rows[index]

    def supervised_indices(self) -> np.ndarray:
        return np.asarray([i for i, p in enumerate(self._train) if p.target is not None], np.int64)

    @property
    def has_code(self) -> bool:
        return any(p.tests for p in (*self._train, *self._eval))

    def score(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Outcome]:
        from verifiers.code import CodeProblem, IOTest, Limits
        from verifiers.math import verify_math

        out: list[Outcome | None] = [None] * len(problems)
        code_items, code_at = [], []
        for i, (p, c) in enumerate(zip(problems, completions, strict=True)):
            if p.answer is not None:
                out[i] = verify_math(p.answer, c)
            else:
                tests = tuple(IOTest(input=a, output=b) for a, b in p.tests)
                code_items.append((c, CodeProblem(tests, limits=Limits(wall_s=5.0))))
                code_at.append(i)
        if code_items:
            for i, outcome in zip(code_at, self._code_verifier().verify_batch(code_items), strict=True):
                out[i] = outcome
        return out  # type: ignore[return-value]
