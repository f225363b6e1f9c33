"""Fixed-width addition: ``037+085=`` → ``122``, checked by the math verifier.

Problem ``j`` of the full space is ``(a, b) = divmod(j, 10**digits)``. ``eval_size`` of them,
chosen by the task seed, are held out and never trained on; training index ``i`` is the ``i``-th
problem that is not held out.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from runtime.errors import UsageError
from runtime.tasks.base import Problem, Task, nth_kept, split_indices
from verifiers.outcome import Outcome


class Arithmetic(Task):
    """``a+b=`` with ``a, b`` zero-padded to ``digits`` digits."""

    name = "arithmetic"
    max_tokens = 5  # the longest answer of the 3-digit sums (4 digits) and the end token

    def __init__(self, digits: int = 3, eval_size: int = 500, seed: int = 0):
        if not isinstance(digits, int) or not 1 <= digits <= 6:
            raise UsageError(f"arithmetic digits must be an integer in 1..6, got {digits!r}")
        self.digits = digits
        self._space = 10 ** (2 * digits)
        if not isinstance(eval_size, int) or not 1 <= eval_size < self._space // 2:
            raise UsageError(f"arithmetic eval_size must be in 1..{self._space // 2 - 1}, got {eval_size!r}")
        self.seed = seed
        self._eval = split_indices(self._space, eval_size, seed)

    @property
    def train_size(self) -> int:
        return self._space - len(self._eval)

    @property
    def eval_size(self) -> int:
        return len(self._eval)

    def max_prompt_chars(self) -> int:
        return 2 * self.digits + 2  # "a+b=" with both operands zero-padded

    def describe(self) -> dict:
        return {"name": self.name, "digits": self.digits, "eval_size": self.eval_size, "seed": self.seed}

    @functools.lru_cache(maxsize=65536)  # noqa: B019 - a task lives as long as its run
    def problem(self, split: str, index: int) -> Problem:
        if split == "eval":
            j = int(self._eval[index])
        elif split == "train":
            if not 0 <= index < self.train_size:
                raise IndexError(f"train index {index} out of range 0..{self.train_size - 1}")
            j = nth_kept(index, self._eval)
        else:
            raise ValueError(f"unknown split {split!r}; accepted: train, eval")
        a, b = divmod(j, 10**self.digits)
        d = self.digits
        answer = str(a + b)
        return Problem(prompt=f"{a:0{d}d}+{b:0{d}d}=", answer=answer, target=answer)

    def score(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Outcome]:
        from verifiers.math import verify_math

        outcomes = []
        for p, c in zip(problems, completions, strict=True):
            assert p.answer is not None  # every arithmetic problem has its answer
            outcomes.append(verify_math(p.answer, c))
        return outcomes
