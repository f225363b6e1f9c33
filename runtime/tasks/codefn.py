"""Program synthesis from examples: write ``f(x)`` given three input/output pairs.

``f(1)=5;f(4)=11;f(0)=3;f(x)=`` → ``2*x+3``. The family is ``a*x+b`` with ``a`` in -9..9 except 0
and ``b`` in -30..30 (1,098 functions); every problem draws its own example inputs, so the same
function appears with different prompts. The completion is run as ``def f(x): return <expr>`` in
the code sandbox against five hidden points (never in the prompt); the reward is the fraction of
hidden points it gets right, and it passes when it gets them all.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from runtime import rng
from runtime.errors import UsageError
from runtime.tasks.base import Problem, Task, split_indices
from verifiers.outcome import Outcome

COEFFICIENTS = [a for a in range(-9, 10) if a != 0]
OFFSETS = list(range(-30, 31))
HIDDEN_POINTS = 5


def _expr(a: int, b: int) -> str:
    return f"{a}*x{b:+d}"


class CodeFunctions(Task):
    """Linear functions from three examples, judged by running the answer in the sandbox."""

    name = "codefn"

    def __init__(self, problems: int = 20000, eval_size: int = 200, seed: int = 0):
        if not isinstance(problems, int) or problems < 2 * eval_size or eval_size < 1:
            raise UsageError(
                f"codefn needs problems >= 2 * eval_size >= 2, got problems={problems!r}, eval_size={eval_size!r}"
            )
        self.problems, self.seed = problems, seed
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
        return 3 * len(f"f(0)={'9' * widest};") + len("f(x)=")

    def describe(self) -> dict:
        return {"name": self.name, "problems": self.problems, "eval_size": self.eval_size, "seed": self.seed}

    def problem(self, split: str, index: int) -> Problem:
        if split not in ("train", "eval"):
            raise ValueError(f"unknown split {split!r}; accepted: train, eval")
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
