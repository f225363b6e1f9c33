"""Tasks: where prompts come from, what a correct answer is, and how a completion is scored.

A task is a pure, indexable dataset: ``problem("train", i)`` is a function of the task's
parameters and ``i`` only, so the controller can log a prompt as an index and every worker (and
every replay) re-derives the same problem. Scoring goes through ``verifiers`` and returns a typed
``Outcome`` plus the reward the trainer uses.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from runtime import rng
from runtime.errors import UsageError
from runtime.model.tokenizer import BOS_ID, EOS_ID
from verifiers.outcome import Outcome


@dataclasses.dataclass(frozen=True)
class TextCodec:
    """Text <-> token ids for prompts and completions, with the model's special tokens.

    A prompt is ``<bos>`` (when the model has one) + the prompt's tokens; a completion ends at
    the first end-of-sequence id. The built-in character tokenizer uses ``BOS_ID``/``EOS_ID``;
    a Hugging Face checkpoint brings its own ids (``config.json``).
    """

    tokenizer: Any
    bos_id: int | None = BOS_ID
    eos_ids: tuple[int, ...] = (EOS_ID,)

    @classmethod
    def for_model(cls, model) -> TextCodec:
        return cls.for_config(model.config, model.tokenizer)

    @classmethod
    def for_config(cls, c, tokenizer) -> TextCodec:
        """The codec of a model with ``ModelConfig`` ``c`` and ``tokenizer`` (no weights needed)."""
        eos = c.eos_token_ids if c.eos_token_ids else (EOS_ID,)
        return cls(tokenizer, c.bos_token_id, tuple(int(e) for e in eos))

    def encode_prompt(self, problem: Problem) -> np.ndarray:
        ids = self.tokenizer.encode(problem.prompt, add_special_tokens=False).ids
        head = [] if self.bos_id is None else [self.bos_id]
        return np.asarray([*head, *ids], np.int32)

    def target_ids(self, problem: Problem) -> list[int]:
        """The supervised completion: the target's tokens and the first end-of-sequence id."""
        return self.tokenizer.encode(problem.target, add_special_tokens=False).ids + [self.eos_ids[0]]

    def decode(self, tokens: Iterable[int]) -> str:
        """The completion text up to (not including) the first end-of-sequence id."""
        ids = [int(t) for t in tokens]
        for i, t in enumerate(ids):
            if t in self.eos_ids:
                ids = ids[:i]
                break
        return self.tokenizer.decode(ids, skip_special_tokens=True)


@dataclasses.dataclass(frozen=True)
class Problem:
    """One prompt and what a correct completion is.

    Attributes:
      prompt: the prompt text (the model sees ``<bos>`` + its characters / tokens).
      answer: the reference final answer (math-style tasks), or None.
      tests: code-style tests, or None (task-specific, e.g. ``(x, f(x))`` pairs or IO tests).
      target: the completion text a supervised warm start trains on (without ``<eos>``).
    """

    prompt: str
    answer: str | None = None
    tests: tuple = ()
    target: str | None = None


class Task(abc.ABC):
    """An indexable dataset of problems with a held-out evaluation split.

    A task with code tests (``has_code``) runs them with ``code_verifier``, which the session
    sets from the run's ``verifier`` section (None: the process-wide default verifier).
    """

    name: str
    code_verifier: Any = None
    reads_path: bool = False
    """Whether the task takes its training problems from a data file (a ``path`` parameter)."""

    @property
    def has_code(self) -> bool:
        """Whether some problem is checked by running code (in the sandbox)."""
        return False

    def supervised_indices(self) -> np.ndarray | None:
        """The training problems that have a ``target`` for the warm start; None: all of them."""
        return None

    def _code_verifier(self) -> Any:
        if self.code_verifier is None:
            from verifiers.code.verify import default_verifier

            return default_verifier()
        return self.code_verifier

    @property
    @abc.abstractmethod
    def train_size(self) -> int:
        """Number of training problems; training indices are ``0 .. train_size - 1``."""

    @property
    @abc.abstractmethod
    def eval_size(self) -> int:
        """Number of held-out problems, never used for training."""

    @abc.abstractmethod
    def problem(self, split: str, index: int) -> Problem:
        """Problem ``index`` of ``split`` (``"train"`` or ``"eval"``)."""

    @abc.abstractmethod
    def score(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Outcome]:
        """Verify each completion against its problem: one typed ``Outcome`` each."""

    def reward(self, outcome: Outcome) -> float:
        """The RL reward of ``outcome``: 1 for AC, else 0 (a task may give partial credit)."""
        return outcome.reward

    @abc.abstractmethod
    def max_prompt_chars(self) -> int:
        """An upper bound on the characters of any prompt of either split.

        A token covers at least one character, so this plus ``<bos>`` bounds the prompt's tokens:
        it fixes the engine's prefill bucket and the trainer's batch width for the whole run.
        """

    def describe(self) -> dict[str, Any]:
        """The task's identity for the run config (name and parameters)."""
        return {"name": self.name}

    def data_row(self, index: int) -> dict[str, Any]:
        """Training problem ``index`` as a JSONL data row that a run reads back as the same
        problem: ``{"prompt", "answer"}`` (and ``"target"`` where the warm-start target differs),
        judged by the math verifier. A task judged otherwise overrides it."""
        p = self.problem("train", index)
        if p.answer is None:
            raise UsageError(f"task {self.name!r} has no answer for prompt {index}: it cannot be written as data")
        row: dict[str, Any] = {"prompt": p.prompt, "answer": p.answer}
        if p.target is not None and p.target != p.answer:
            row["target"] = p.target
        return row



def split_indices(total: int, eval_size: int, seed: int, purpose: str = rng.EVAL_SPLIT) -> np.ndarray:
    """A sorted set of ``eval_size`` distinct indices of ``range(total)`` held out for evaluation,
    drawn from the run's stream ``purpose``."""
    gen = rng.generator(seed, purpose, total)
    return np.sort(gen.choice(total, size=eval_size, replace=False)).astype(np.int64)


def nth_kept(i: int, excluded_sorted: np.ndarray) -> int:
    """The ``i``-th integer (0-based) not in ``excluded_sorted``."""
    x = i
    while True:
        skipped = int(np.searchsorted(excluded_sorted, x, side="right"))
        if x - skipped == i:
            return x
        x = i + skipped
