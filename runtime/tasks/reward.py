"""A task scored by the user's own reward function (``verifier.reward``).

:class:`UserReward` keeps everything of the task it wraps — its prompts, answers, held-out split,
warm-start targets — and replaces only the scoring: each completion is scored by the user's
``reward(prompt, completion, answer)`` in the sandbox (``verifiers.reward``), and the number it
returns is the completion's reward. Every place that scores (the verifier workers, the held-out
evaluation) scores through it, so they all agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from runtime.tasks.base import Problem, Task, TextCodec
from verifiers.outcome import Outcome


class UserReward(Task):
    """``task`` with its scoring replaced by ``verifier``, a ``verifiers.reward.RewardVerifier``."""

    def __init__(self, task: Task, verifier: Any):
        self.task = task
        self.verifier = verifier
        self.name = task.name
        self.package, self.version = task.package, task.version
        self.reads_path, self.takes_options, self.max_tokens = task.reads_path, task.takes_options, task.max_tokens

    def __getattr__(self, name: str) -> Any:  # what only the wrapped task has (a data file's path, ...)
        if name == "task":
            raise AttributeError(name)
        return getattr(self.task, name)

    @property
    def train_size(self) -> int:
        return self.task.train_size

    @property
    def eval_size(self) -> int:
        return self.task.eval_size

    def problem(self, split: str, index: int) -> Problem:
        return self.task.problem(split, index)

    def supervised_indices(self) -> np.ndarray | None:
        return self.task.supervised_indices()

    def max_prompt_chars(self) -> int:
        return self.task.max_prompt_chars()

    def prompt_where(self, split: str, index: int) -> str:
        return self.task.prompt_where(split, index)

    def max_prompt_tokens(self, codec: TextCodec, *, limit: int, why: str) -> int:
        return self.task.max_prompt_tokens(codec, limit=limit, why=why)

    def describe(self) -> dict[str, Any]:
        """The wrapped task's: the problems are its (the warm start's cache is keyed by them)."""
        return self.task.describe()

    def data_row(self, index: int) -> dict[str, Any]:
        return self.task.data_row(index)

    def score(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Outcome]:
        """The user's reward of each completion, as an ``Outcome`` whose ``credit`` is the reward."""
        return self.verifier.score([(p.prompt, c, p.answer) for p, c in zip(problems, completions, strict=True)])

    def reward(self, outcome: Outcome) -> float:
        """The number the user's function returned (0 for a call that failed)."""
        return outcome.reward

    def check(self) -> None:
        """Call the user's function once, on the first training problem with its reference answer
        (else its warm-start target) as the completion: a one-line error before the run starts
        when it does not load or does not return a number."""
        p = self.problem("train", 0)
        self.verifier.check((p.prompt, p.answer if p.answer is not None else p.target or "", p.answer))


__all__ = ["UserReward"]
