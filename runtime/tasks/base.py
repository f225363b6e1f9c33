"""Tasks: where prompts come from, what a correct answer is, and how a completion is scored.

A task is a pure, indexable dataset: ``problem("train", i)`` is a function of the task's
parameters and ``i`` only, so the controller can log a prompt as an index and every worker (and
every replay) re-derives the same problem. Scoring goes through ``verifiers`` and returns a typed
``Outcome`` plus the reward the trainer uses.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from runtime import rng
from runtime.errors import UsageError
from runtime.model.tokenizer import BOS_ID, EOS_ID, PAD_ID
from verifiers.outcome import Outcome


@dataclasses.dataclass(frozen=True)
class TextCodec:
    """Text <-> token ids for prompts and completions, with the model's special tokens.

    A plain prompt is ``<bos>`` (when the model's tokenizer starts prompts with one) + the
    prompt's tokens. With a chat ``template`` the prompt is the template's rendering of the
    problem's messages (a ``{"prompt"}`` row is one user message) with the generation prompt
    appended, tokenized as it is: the template writes any BOS itself. A completion ends at the
    first of ``eos_ids``; a supervised target ends with ``eos_ids[0]``.

    Attributes:
      tokenizer: a ``tokenizers.Tokenizer``.
      bos_id: prepended to a plain prompt, or None.
      eos_ids: every id that ends a completion.
      pad_id: the id of padded positions (masked out of attention and loss).
      template: a ``runtime.model.chat_template.ChatTemplate``, or None.
      char_level: the tokenizer maps each character to one token (the built-in tokenizer), so a
        prompt's characters bound its tokens without encoding it.
      max_prompt_tokens: ``data.max_prompt_tokens``: ``encode_prompt`` refuses a longer prompt.
    """

    tokenizer: Any
    bos_id: int | None = BOS_ID
    eos_ids: tuple[int, ...] = (EOS_ID,)
    pad_id: int = PAD_ID
    template: Any = None
    char_level: bool = False
    max_prompt_tokens: int | None = None

    @classmethod
    def builtin(cls) -> TextCodec:
        """The codec of the built-in character-level tokenizer."""
        from runtime.model.tokenizer import char_tokenizer

        return cls(char_tokenizer(), char_level=True)

    @classmethod
    def for_checkpoint(cls, text) -> TextCodec:
        """The codec of a checkpoint's ``runtime.model.hf_text.CheckpointText``."""
        from runtime.model.tokenizer import one_token_per_char

        return cls(text.tokenizer, text.bos_id, tuple(text.eos_ids), text.pad_id, text.chat_template,
                   char_level=text.chat_template is None and one_token_per_char(text.tokenizer))

    @property
    def template_digest(self) -> str | None:
        """sha256 of the chat template's text, or None without one."""
        return None if self.template is None else self.template.digest

    @property
    def template_file(self) -> str | None:
        """The checkpoint file the chat template was read from, or None without one."""
        return None if self.template is None else self.template.origin or None

    def prompt_text(self, problem: Problem) -> str:
        """The text the model is prompted with (before ``<bos>``)."""
        if self.template is None:
            if problem.messages:
                raise UsageError('a {"messages"} row needs the checkpoint\'s chat template: set '
                                 "data.chat_template=true")
            return problem.prompt
        messages = problem.messages or (("user", problem.prompt),)
        return self.template.render([{"role": role, "content": content} for role, content in messages])

    def _with_bos(self, ids: Sequence[int]) -> np.ndarray:
        head = [] if self.bos_id is None or self.template is not None else [self.bos_id]
        return np.asarray([*head, *ids], np.int32)

    def encode_prompt(self, problem: Problem) -> np.ndarray:
        ids = self._with_bos(self.tokenizer.encode(self.prompt_text(problem), add_special_tokens=False).ids)
        if self.max_prompt_tokens is not None and ids.size > self.max_prompt_tokens:
            raise UsageError(f"the prompt {problem.prompt[:60]!r} has {ids.size} tokens, more than "
                             f"data.max_prompt_tokens {self.max_prompt_tokens}")
        return ids

    def encode_prompts(self, problems: Sequence[Problem]) -> list[np.ndarray]:
        """``encode_prompt`` of each problem, encoded as one batch."""
        texts = [self.prompt_text(p) for p in problems]
        return [self._with_bos(e.ids) for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

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
      messages: ``(role, content)`` pairs of a chat prompt, rendered by the model's chat template
        (empty: the prompt is ``prompt``, one user message under a template); ``prompt`` is then
        the last message's content, for display.
    """

    prompt: str
    answer: str | None = None
    tests: tuple = ()
    target: str | None = None
    messages: tuple[tuple[str, str], ...] = ()


class Task(abc.ABC):
    """An indexable dataset of problems with a held-out evaluation split.

    A task with code tests (``has_code``) runs them with ``code_verifier``, which the session
    sets from the run's ``verifier`` section (None: the process-wide default verifier).
    """

    name: str
    code_verifier: Any = None
    reads_path: bool = False
    """Whether the task takes its training problems from a data file (a ``path`` parameter)."""
    max_tokens: int = 8
    """Completion tokens a rollout may take when ``sampling.max_tokens`` does not say."""
    takes_options: bool = False
    """Whether the task takes ``data.options`` (its source's own config)."""
    package: str | None = None
    """The package the problems and their scoring come from (None: rlx itself)."""
    version: str | None = None
    """That package's installed version, recorded as ``data.task_version``."""

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
        """An upper bound on the characters of any prompt of either split (its tokens, under a
        character-level tokenizer)."""

    def prompt_where(self, split: str, index: int) -> str:
        """Where problem ``index`` of ``split`` comes from, for error messages."""
        return f"task {self.name!r} {split} problem {index}"

    def max_prompt_tokens(self, codec: TextCodec, *, limit: int, why: str) -> int:
        """The longest prompt of either split in ``codec``'s tokens (its ``<bos>`` included).

        It fixes the engine's prefill bucket and the trainer's batch width for the whole run.
        Under a character-level codec the characters bound it without encoding anything; else
        every prompt is encoded once, and one longer than ``limit`` is an error naming it
        (``why`` says where the limit comes from).
        """
        if codec.char_level:
            return self.max_prompt_chars() + (codec.bos_id is not None)
        return scan_prompt_tokens(self, codec, limit=limit, why=why)

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


SCAN_CHUNK = 4096


def scan_prompt_tokens(task: Task, codec: TextCodec, *, limit: int, why: str) -> int:
    """The longest prompt of ``task`` in ``codec``'s tokens, every prompt encoded; the first one
    longer than ``limit`` is a one-line error naming it."""
    longest = 0
    for split, size in (("train", task.train_size), ("eval", task.eval_size)):
        for start in range(0, size, SCAN_CHUNK):
            indices = range(start, min(size, start + SCAN_CHUNK))
            for i, ids in zip(indices, codec.encode_prompts([task.problem(split, i) for i in indices]), strict=True):
                if ids.size > limit:
                    raise UsageError(f"{task.prompt_where(split, i)}: its prompt has {ids.size} tokens, more than the "
                                     f"{limit} a prompt may have ({why})")
                longest = max(longest, int(ids.size))
    return longest


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


def json_lines(path: str, expected: str) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed row)`` of every non-blank line of the JSONL file ``path``, with one
    clear error for a missing file (``expected`` says what it should hold) or the first line that
    is not JSON."""
    if not os.path.isfile(path):
        raise UsageError(f"data file {path!r} does not exist (expected {expected})")
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise UsageError(f"{path}:{line_no}: not valid JSON ({e.msg} at column {e.colno})") from None
            yield line_no, row
