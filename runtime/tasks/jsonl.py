"""Users' own data: a JSONL file of ``{"prompt", "answer"}`` or ``{"prompt", "tests"}`` rows.

Instead of ``"prompt"`` a row may give ``"messages"``, a chat as ``[{"role", "content"}, ...]``
(roles ``system``, ``user``, ``assistant``, ``tool``), which the checkpoint's chat template
renders (``data.chat_template=true``); under a template a ``"prompt"`` is one user message.

``answer`` rows are checked by the math verifier; ``tests`` rows (a list of
``{"input": ..., "output": ...}`` stdin/stdout pairs) run the completion as a Python program in
the code sandbox. An optional ``"target"`` gives the supervised warm-start completion (default:
the answer). A deterministic ``eval_fraction`` of the rows (chosen by the seed) is held out.
Malformed rows are rejected up front, naming the file, line and problem, and so is a row whose
prompt has more tokens than the run accepts (see :meth:`JsonlTask.max_prompt_tokens`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np

from runtime.errors import UsageError
from runtime.tasks.base import Problem, Task, TextCodec, json_lines, scan_prompt_tokens, split_indices
from verifiers.outcome import Outcome

ROLES = ("system", "user", "assistant", "tool")
MAX_MESSAGES = 1024


def _messages(where: str, messages: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(messages, list) or not 1 <= len(messages) <= MAX_MESSAGES:
        raise UsageError(f"{where}: 'messages' must be a list of 1..{MAX_MESSAGES} "
                         '{"role", "content"} objects')
    pairs = []
    for k, m in enumerate(messages):
        if not (isinstance(m, dict) and set(m) == {"role", "content"} and m["role"] in ROLES
                and isinstance(m["content"], str)):
            raise UsageError(f"{where}: messages[{k}] must be {{\"role\": one of {', '.join(ROLES)}, "
                             f"\"content\": str}}, got {m!r}"[:400])
        pairs.append((m["role"], m["content"]))
    return tuple(pairs)


def _row_problem(path: str, line_no: int, row: object) -> Problem:
    where = f"{path}:{line_no}"
    if not isinstance(row, dict):
        raise UsageError(f"{where}: each line must be a JSON object, got {type(row).__name__}")
    unknown = sorted(set(row) - {"prompt", "messages", "answer", "tests", "target"})
    if "calls" in row:
        raise UsageError(f"{where}: 'calls' rows are function tests of the codefn task; read this file with "
                         '--set data.task=codefn (data.path names it)')
    if unknown:
        raise UsageError(f"{where}: unknown keys {unknown}; accepted: prompt or messages, answer, tests, target")
    if ("prompt" in row) == ("messages" in row):
        raise UsageError(f"{where}: give exactly one of 'prompt' (text) or 'messages' (a chat)")
    messages = _messages(where, row["messages"]) if "messages" in row else ()
    prompt = messages[-1][1] if messages else row.get("prompt")
    if not messages and (not isinstance(prompt, str) or not prompt):
        raise UsageError(f"{where}: 'prompt' must be a non-empty string, got {prompt!r}")
    assert isinstance(prompt, str)
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
        return Problem(prompt=prompt, answer=answer, target=target if target is not None else answer,
                       messages=messages)
    tests = row["tests"]
    if not isinstance(tests, list) or not tests:
        raise UsageError(f"{where}: 'tests' must be a non-empty list of {{\"input\", \"output\"}} objects")
    pairs = []
    for k, t in enumerate(tests):
        if not (isinstance(t, dict) and set(t) == {"input", "output"}
                and isinstance(t["input"], str) and isinstance(t["output"], str)):
            raise UsageError(f"{where}: tests[{k}] must be {{\"input\": str, \"output\": str}}, got {t!r}")
        pairs.append((t["input"], t["output"]))
    return Problem(prompt=prompt, tests=tuple(pairs), target=target, messages=messages)


def load_problems(path: str) -> list[Problem]:
    """Every row of a JSONL file as a ``Problem``; one clear error for the first bad row."""
    return [p for _, p in _numbered_problems(path)]


def _numbered_problems(path: str) -> list[tuple[int, Problem]]:
    """``(line number, problem)`` of every row."""
    problems = [(line_no, _row_problem(path, line_no, row)) for line_no, row in json_lines(path, "a JSONL file")]
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
        numbered = _numbered_problems(self.path)
        rows = [p for _, p in numbered]
        n_eval = max(1, min(len(rows) - 1, round(len(rows) * eval_fraction)))
        held = set(split_indices(len(rows), n_eval, seed).tolist())
        self._train_rows = [i for i in range(len(rows)) if i not in held]
        self._eval_rows = [i for i in range(len(rows)) if i in held]
        self._train = [rows[i] for i in self._train_rows]
        self._eval = [rows[i] for i in self._eval_rows]
        self._lines = [line for line, _ in numbered]

    @property
    def train_size(self) -> int:
        return len(self._train)

    @property
    def eval_size(self) -> int:
        return len(self._eval)

    def max_prompt_chars(self) -> int:
        return max(len(p.prompt) for p in self._train + self._eval)

    def prompt_where(self, split: str, index: int) -> str:
        rows = self._train_rows if split == "train" else self._eval_rows
        return f"{self.path}:{self._lines[rows[index]]}"

    def max_prompt_tokens(self, codec: TextCodec, *, limit: int, why: str) -> int:
        """Every row's prompt encoded (the rows are in memory already); a row over ``limit`` is
        an error naming its line, and so is a ``messages`` row without a chat template."""
        return scan_prompt_tokens(self, codec, limit=limit, why=why)

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
