"""Program synthesis from examples: write ``f(x)`` given three input/output pairs.

``f(1)=5;f(4)=11;f(0)=3;f(x)=`` → ``2*x+3``. The family is ``a*x+b`` with ``a`` in -9..9 except 0
and ``b`` in -30..30 (1,098 functions); every problem draws its own example inputs, so the same
function appears with different prompts. The completion is run as ``def f(x): return <expr>`` in
the code sandbox against five hidden points (never in the prompt); the reward is the fraction of
hidden points it gets right, and it passes when it gets them all.

The training problems may come from a JSONL file instead (``data.path`` with ``data.task =
"codefn"``), e.g. the prompts ``rlx curate`` kept from a codefn run. A row is a function-test row::

    {"prompt": "f(1)=5;f(4)=11;f(0)=3;f(x)=", "calls": [{"args": [-7], "output": -11}, ...],
     "target": "2*x+3"}

``calls`` are the hidden points (``f(*args) == output``, at most :data:`MAX_CALLS`), ``target``
the optional warm-start completion. Such rows are judged exactly as generated problems are (the
completion run as ``f``'s return expression in the sandbox, partial credit per call), and the
held-out split stays the generated one (held-out functions), so a run on a file is evaluated on
the same problems as a run on the generated family.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from runtime import rng
from runtime.errors import UsageError
from runtime.tasks.base import Problem, Task, json_lines, split_indices
from verifiers.outcome import Outcome

COEFFICIENTS = [a for a in range(-9, 10) if a != 0]
OFFSETS = list(range(-30, 31))
HIDDEN_POINTS = 5
MAX_CALLS = 64
"""Calls per row of a data file."""


def _expr(a: int, b: int) -> str:
    return f"{a}*x{b:+d}"


class CodeFunctions(Task):
    """Linear functions from three examples, judged by running the answer in the sandbox."""

    name = "codefn"
    reads_path = True

    def __init__(self, problems: int = 20000, eval_size: int = 200, seed: int = 0, path: str | None = None):
        if not isinstance(problems, int) or problems < 2 * eval_size or eval_size < 1:
            raise UsageError(
                f"codefn needs problems >= 2 * eval_size >= 2, got problems={problems!r}, eval_size={eval_size!r}"
            )
        self.path = None if path is None else os.path.abspath(path)
        self._rows: list[Problem] | None = None
        self._lines: list[int] = []
        if self.path is not None:
            self._rows, self._lines = load_rows(self.path)
        self.problems, self.seed = (problems if self._rows is None else len(self._rows)), seed
        functions = len(COEFFICIENTS) * len(OFFSETS)
        # Held-out *functions*, so evaluation measures generalisation, not memorisation.
        self._eval_functions = set(split_indices(functions, max(1, functions // 10), seed, rng.CODE_FUNCTIONS).tolist())
        self._eval_size = eval_size

    @property
    def train_size(self) -> int:
        return self.problems

    @property
    def eval_size(self) -> int:
        return self._eval_size

    def max_prompt_chars(self) -> int:
        widest = max(len(str(a * x + b)) for a in COEFFICIENTS for b in OFFSETS for x in range(10))
        generated = 3 * len(f"f(0)={'9' * widest};") + len("f(x)=")
        return max([generated, *(len(p.prompt) for p in self._rows or ())])

    def describe(self) -> dict:
        out = {"name": self.name, "problems": self.problems, "eval_size": self.eval_size, "seed": self.seed}
        return out if self.path is None else {**out, "path": self.path}

    def supervised_indices(self) -> np.ndarray | None:
        if self._rows is None:
            return None
        return np.asarray([i for i, p in enumerate(self._rows) if p.target is not None], np.int64)

    def prompt_where(self, split: str, index: int) -> str:
        if split == "train" and self._rows is not None:
            return f"{self.path}:{self._lines[index]}"
        return super().prompt_where(split, index)

    def train_row(self, index: int) -> int:
        """The row of the data file (see ``runtime.tasks.jsonl.read_rows``) of training problem ``index``."""
        return index

    def data_row(self, index: int) -> dict:
        """Training problem ``index`` as a function-test row (the form a data file holds)."""
        p = self.problem("train", index)
        row: dict = {"prompt": p.prompt, "calls": [{"args": [x], "output": y} for x, y in p.tests]}
        return row if p.target is None else {**row, "target": p.target}

    def problem(self, split: str, index: int) -> Problem:
        if split not in ("train", "eval"):
            raise ValueError(f"unknown split {split!r}; accepted: train, eval")
        if split == "train" and self._rows is not None:
            return self._rows[index]
        held_out = split == "eval"
        gen = rng.generator(self.seed, rng.CODE_PROBLEM, int(held_out), index)
        while True:
            f = int(gen.integers(len(COEFFICIENTS) * len(OFFSETS)))
            if (f in self._eval_functions) == held_out:
                break
        a, b = COEFFICIENTS[f // len(OFFSETS)], OFFSETS[f % len(OFFSETS)]
        shown = gen.choice(10, size=3, replace=False)
        hidden = gen.choice(np.arange(-20, 21), size=HIDDEN_POINTS, replace=False)
        prompt = "".join(f"f({int(x)})={a * int(x) + b};" for x in shown) + "f(x)="
        tests = tuple((int(x), a * int(x) + b) for x in hidden)
        return Problem(prompt=prompt, answer=_expr(a, b), tests=tests, target=_expr(a, b))

    def score(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Outcome]:
        from verifiers.code import CallTest, CodeProblem, Limits

        verifier = self._code_verifier()
        items = []
        for p, c in zip(problems, completions, strict=True):
            program = f"def f(x):\n    return ({c})\n"
            tests = tuple(CallTest(fn="f", args=(x,), expected=y) for x, y in p.tests)
            items.append((program, CodeProblem(tests, limits=Limits(wall_s=5.0), stop_early=False)))
        return verifier.verify_batch(items)

    @property
    def has_code(self) -> bool:
        return True

    def reward(self, outcome: Outcome) -> float:
        """Partial credit: the fraction of the hidden points the program gets right."""
        passed_tests = sum(1 for t in outcome.tests if t.passed)
        return passed_tests / len(outcome.tests) if outcome.tests else 0.0


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _row(where: str, row: object) -> Problem:
    if not isinstance(row, dict):
        raise UsageError(f"{where}: each line must be a JSON object, got {type(row).__name__}")
    unknown = sorted(set(row) - {"prompt", "calls", "target"})
    if unknown:
        raise UsageError(f"{where}: unknown keys {unknown}; a codefn row accepts: prompt, calls, target")
    prompt, calls, target = row.get("prompt"), row.get("calls"), row.get("target")
    if not isinstance(prompt, str) or not prompt:
        raise UsageError(f"{where}: 'prompt' must be a non-empty string, got {prompt!r}")
    if target is not None and not isinstance(target, str):
        raise UsageError(f"{where}: 'target' must be a string, got {target!r}")
    if not isinstance(calls, list) or not 1 <= len(calls) <= MAX_CALLS:
        raise UsageError(f"{where}: 'calls' must be a list of 1 to {MAX_CALLS} "
                         '{"args": [x], "output": y} objects (f(x) == y, numbers)')
    tests = []
    for k, c in enumerate(calls):
        if not (isinstance(c, dict) and set(c) == {"args", "output"} and isinstance(c["args"], list)
                and len(c["args"]) == 1 and _number(c["args"][0]) and _number(c["output"])):
            raise UsageError(f'{where}: calls[{k}] must be {{"args": [x], "output": y}} with numbers x and y '
                             f"(f takes one argument), got {c!r}")
        tests.append((c["args"][0], c["output"]))
    return Problem(prompt=prompt, answer=target, tests=tuple(tests), target=target)


def load_rows(path: str) -> tuple[list[Problem], list[int]]:
    """The function-test rows of a JSONL file as problems, and their line numbers; one clear error
    for the first bad row."""
    problems, lines = [], []
    for line_no, row in json_lines(path, "a JSONL file of codefn rows"):
        problems.append(_row(f"{path}:{line_no}", row))
        lines.append(line_no)
    if not problems:
        raise UsageError(f"data file {path!r} has no rows; codefn needs at least one training row")
    return problems, lines
