"""Problems from reasoning-gym's procedural generators: ``data.task = "gym:<dataset>"``.

Any dataset of reasoning-gym (``chain_sum``, ``basic_arithmetic``, ``gsm_symbolic``, …) is a
task. ``data.options`` holds the dataset's own config fields (e.g. ``min_terms``) and three of the
task's:

- ``train_size`` (100,000): training problems; the controller draws indices in ``[0, train_size)``.
- ``eval_size`` (500): held-out problems (``eval.size`` evaluates the first of them).
- ``system``: a system message put before every question (rendered by a chat template).
- ``answer`` (``"tag"``): how a completion's answer is read, below.

Seeds come from the run seed (``runtime.rng``): the held-out problems are entries ``0 ..
eval_size - 1`` of a generator seeded from :data:`~runtime.rng.GYM_EVAL`; training problem ``i``
is entry ``i`` of training generator 0 (:data:`~runtime.rng.GYM_TRAIN`, draw 0) unless its
question is a held-out one, then entry ``i`` of generator 1, and so on up to :data:`MAX_DRAWS`
generators, so no held-out question is ever trained on.

When a run starts every problem of both splits is generated once (:meth:`GymTask.max_prompt_tokens`):
the longest prompt fixes the engine's prefill bucket, a dataset with too few distinct questions to
hold out ``eval_size`` of them is refused, and so is a character the built-in character-level
tokenizer does not have. That takes seconds for most generators at the default ``train_size``; a
slow one wants a smaller ``train_size``, or ``data.max_prompt_tokens``, which bounds every prompt
instead (nothing is generated up front; a longer prompt is refused when it is encoded, and only the
held-out split's characters are checked).

A completion's answer is the text inside its last ``<answer>…</answer>`` (else the whole
completion), stripped; with ``answer = "last_number"`` it is the last number of that text (an
integer or decimal, with its sign), for a numeric dataset and a model that states its result in a
sentence ("The answer is 9."). It is scored by the dataset's own ``score_answer``: the reward is that
score (partial credit in ``[0, 1]``), the verdict ``AC`` at 1 and ``WA`` below (``PARSE_ERROR``
for an empty answer). The installed reasoning-gym version is recorded in the run's config
(``data.task_version``): a replay or resume under another version is refused.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from runtime import rng
from runtime.errors import UsageError
from runtime.tasks.base import Problem, Task, TextCodec
from verifiers.outcome import Outcome, Verdict

PREFIX = "gym:"
PACKAGE = "reasoning-gym"
INSTALL = "pip install 'rlx[gym]' (or scripts/setup gym)"
TASK_OPTIONS: dict[str, Any] = {"train_size": 100_000, "eval_size": 500, "system": None, "answer": "tag"}
"""The task's own options and their defaults; every other key of ``data.options`` is the dataset's."""
RESERVED = ("seed", "size")  # dataset config fields the task sets itself
MAX_TRAIN_SIZE = 10_000_000
MAX_EVAL_SIZE = 100_000
MAX_DRAWS = 16
"""Training generators tried for one training problem before its question counts as always held out."""
EVAL_DRAW = -1
SEED_BITS = 31
"""Generators seed ``random.Random`` (some numpy's legacy ``seed``, capped at 2**32 - 1) with
``seed + index``: a 31-bit seed leaves room for any index below 2**31."""
DETAIL_ANSWER_CHARS = 80

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
ANSWER_RULES = ("tag", "last_number")
_GENERATING = threading.Lock()
"""One entry is generated at a time in a process: a generator may seed and draw from a process-wide
RNG (pool_matrix reseeds numpy's), which roles running as threads must not interleave."""


def extract_answer(completion: str, rule: str = "tag") -> str:
    """The text inside the last ``<answer>…</answer>`` of ``completion`` (else all of it), stripped;
    with ``rule`` ``"last_number"`` the last number of that text ("" without one)."""
    found = _ANSWER_TAG.findall(completion)
    text = (found[-1] if found else completion).strip()
    if rule == "last_number":
        numbers = _NUMBER.findall(text)
        return numbers[-1].lstrip("+") if numbers else ""
    return text


def _line(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]


@dataclasses.dataclass(frozen=True)
class GymProblem(Problem):
    """A problem and the generator entry it is (scoring needs the entry's metadata).

    Attributes:
      draw: the generator: :data:`EVAL_DRAW` for the held-out one, else the training draw.
      entry: the entry's index in that generator.
    """

    draw: int = 0
    entry: int = 0


@dataclasses.dataclass(frozen=True)
class GymOutcome(Outcome):
    """An ``Outcome`` with the dataset's score, which is its reward (partial credit)."""

    score: float = 0.0

    @property
    def reward(self) -> float:
        return self.score


@dataclasses.dataclass(frozen=True)
class _Scan:
    longest: int  # characters of the longest question
    chars: frozenset[str]  # every character of the questions and answers
    untargeted: tuple[int, ...]  # training problems without an answer to warm-start on


def _library(task: str) -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise UsageError(f"data.task {task!r} needs {PACKAGE}, which is not installed: {INSTALL}") from None
    return reasoning_gym


def installed_version() -> str | None:
    """The installed reasoning-gym's version, or None when it is not installed."""
    from importlib import metadata

    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return None


class GymTask(Task):
    """A reasoning-gym dataset with a held-out split, scored by the dataset's ``score_answer``."""

    takes_options = True
    package = PACKAGE
    max_tokens = 32  # short final answers (a number, a word) and the end token

    def __init__(self, dataset: str, seed: int = 0, options: Mapping[str, Any] | None = None):
        self.name = PREFIX + dataset
        self.dataset, self.seed = dataset, seed
        self.options = dict(options or {})
        gym = _library(self.name)
        from reasoning_gym.factory import DATASETS

        if dataset not in DATASETS:
            raise UsageError(f"data.task {self.name!r}: {PACKAGE} has no dataset {dataset!r}; accepted: gym:<dataset> "
                             f"for a dataset of {', '.join(sorted(DATASETS))}")
        self._create = gym.create_dataset
        self.version = installed_version() or str(getattr(gym, "__version__", "unknown"))
        own = {k: self.options.get(k, default) for k, default in TASK_OPTIONS.items()}
        self.config = {k: v for k, v in self.options.items() if k not in TASK_OPTIONS}
        fields = [f.name for f in dataclasses.fields(DATASETS[dataset][1])]
        accepted = ", ".join([*(f for f in fields if f not in RESERVED), *TASK_OPTIONS])
        for key in self.config:
            if key in RESERVED:
                raise UsageError(f"data.options.{key} is not accepted: the generators' seeds come from run.seed and "
                                 f"their sizes from train_size and eval_size; accepted: {accepted}")
            if key not in fields:
                raise UsageError(f"data.options.{key} is not an option of {PACKAGE} dataset {dataset!r}; "
                                 f"accepted: {accepted}")
        self._train_size = self._count("train_size", own["train_size"], MAX_TRAIN_SIZE)
        self._eval_size = self._count("eval_size", own["eval_size"], MAX_EVAL_SIZE)
        system = own["system"]
        if system is not None and (not isinstance(system, str) or not system.strip()):
            raise UsageError(f"data.options.system {system!r} is not accepted; give the system message's text")
        self.system: str | None = system
        if own["answer"] not in ANSWER_RULES:
            raise UsageError(f"data.options.answer {own['answer']!r} is not accepted; accepted: {', '.join(ANSWER_RULES)}")
        self.answer_rule: str = own["answer"]
        self._generators: dict[int, Any] = {}
        held = [self._make("eval", i) for i in range(self._eval_size)]
        self._held = frozenset(p.prompt for p in held)
        self._held_chars = frozenset(c for p in held for c in p.prompt + (p.answer or ""))

    @staticmethod
    def _count(name: str, value: Any, most: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise UsageError(f"data.options.{name} {value!r} is not accepted; it must be an integer in 1..{most}")
        return value

    @property
    def train_size(self) -> int:
        return self._train_size

    @property
    def eval_size(self) -> int:
        return self._eval_size

    def describe(self) -> dict:
        return {"name": self.name, "options": self.options, "train_size": self.train_size,
                "eval_size": self.eval_size, "seed": self.seed, "version": self.version}

    def _generator(self, draw: int) -> Any:
        """The dataset generator ``draw`` (:data:`EVAL_DRAW`: the held-out one), its seed from the run's."""
        gen = self._generators.get(draw)
        if gen is None:
            if draw == EVAL_DRAW:
                seed, size = rng.derive_seed(self.seed, rng.GYM_EVAL), self.eval_size
            else:
                seed, size = rng.derive_seed(self.seed, rng.GYM_TRAIN, draw), self.train_size
            try:
                gen = self._create(self.dataset, seed=seed >> (rng.SEED_BITS - SEED_BITS), size=size, **self.config)
            except Exception as e:  # the dataset's config checks raise what they like (asserts included)
                raise UsageError(f"data.options {self.config!r} are not accepted by {PACKAGE} dataset "
                                 f"{self.dataset!r}: {_line(e)}") from None
            self._generators[draw] = gen
        return gen

    def _entry_of(self, draw: int, index: int) -> dict:
        try:
            with _GENERATING:
                entry = self._generator(draw)[index]
        except UsageError:
            raise
        except Exception as e:
            raise UsageError(f"{PACKAGE} dataset {self.dataset!r} with options {self.config!r} failed to generate "
                             f"entry {index}: {_line(e)}") from None
        if not isinstance(entry, Mapping) or not isinstance(entry.get("question"), str) or not entry["question"]:
            raise UsageError(f"{PACKAGE} dataset {self.dataset!r} generated entry {index} without a question")
        return dict(entry)

    @functools.lru_cache(maxsize=1024)  # noqa: B019 - a task lives as long as its run
    def _entry(self, draw: int, index: int) -> dict:
        return self._entry_of(draw, index)

    def _make(self, split: str, index: int) -> GymProblem:
        if split == "eval":
            if not 0 <= index < self.eval_size:
                raise IndexError(f"eval index {index} out of range 0..{self.eval_size - 1}")
            return self._problem(self._entry_of(EVAL_DRAW, index), EVAL_DRAW, index)
        if split != "train":
            raise ValueError(f"unknown split {split!r}; accepted: train, eval")
        if not 0 <= index < self.train_size:
            raise IndexError(f"train index {index} out of range 0..{self.train_size - 1}")
        for draw in range(MAX_DRAWS):
            entry = self._entry_of(draw, index)
            if entry["question"] not in self._held:
                return self._problem(entry, draw, index)
        raise UsageError(f"task {self.name!r}: training problem {index} is a held-out question in each of its "
                         f"{MAX_DRAWS} draws: the dataset has too few distinct questions to hold out "
                         f"{self.eval_size}; lower data.options.eval_size or widen the dataset's options")

    def _problem(self, entry: dict, draw: int, index: int) -> GymProblem:
        question, answer = entry["question"], entry.get("answer")
        text = None if answer is None else str(answer)
        messages = () if self.system is None else (("system", self.system), ("user", question))
        return GymProblem(prompt=question, answer=text, target=text, messages=messages, draw=draw, entry=index)

    @functools.lru_cache(maxsize=65536)  # noqa: B019 - a task lives as long as its run
    def problem(self, split: str, index: int) -> GymProblem:
        return self._make(split, index)

    @functools.cached_property
    def _scan(self) -> _Scan:
        """Every problem of both splits generated once: the longest question, the characters of
        questions and answers, and the training problems without an answer."""
        longest, chars, untargeted = 0, set[str](), []
        for split, size in (("train", self.train_size), ("eval", self.eval_size)):
            for i in range(size):
                p = self._make(split, i)
                longest = max(longest, len(p.prompt))
                chars.update(p.prompt, p.answer or "")
                if split == "train" and p.target is None:
                    untargeted.append(i)
        return _Scan(longest, frozenset(chars), tuple(untargeted))

    def max_prompt_chars(self) -> int:
        return self._scan.longest

    def max_prompt_tokens(self, codec: TextCodec, *, limit: int, why: str) -> int:
        """As ``Task.max_prompt_tokens`` (every problem generated once), after checking that the
        codec can render the prompts: a system message needs a chat template, and a
        character-level tokenizer must have every character of the questions and answers (else
        it would read ``<unk>`` and the model could never write the answer). Under
        ``data.max_prompt_tokens`` (the codec's cap) that cap is the bound and nothing is
        generated: the codec refuses a longer prompt when it is encoded."""
        if self.system is not None and codec.template is None:
            raise UsageError("data.options.system is a system message, which needs the checkpoint's chat template: "
                             "set data.chat_template=true with --model, or leave data.options.system out")
        cap = codec.max_prompt_tokens
        if codec.char_level:
            chars = self._scan.chars if cap is None else self._held_chars
            unknown = "".join(sorted(c for c in chars if codec.tokenizer.token_to_id(c) is None))
            if unknown:
                raise UsageError(f"task {self.name!r}: its questions or answers use characters the model's tokenizer "
                                 f"does not have ({unknown!r}); give a checkpoint whose tokenizer covers them "
                                 "(--model), or a dataset whose text it covers (the built-in model's: digits, "
                                 "lowercase letters, spaces and some punctuation, e.g. gym:number_sequence)")
        if cap is not None:
            return cap
        return super().max_prompt_tokens(codec, limit=limit, why=why)

    def supervised_indices(self) -> np.ndarray | None:
        """The training problems whose entry has an answer (some datasets judge without one):
        every problem is generated once to find them."""
        untargeted = self._scan.untargeted
        if not untargeted:
            return None
        return np.setdiff1d(np.arange(self.train_size, dtype=np.int64), np.asarray(untargeted, np.int64))

    def data_row(self, index: int) -> dict[str, Any]:
        raise UsageError(f"task {self.name!r} is judged by {PACKAGE}'s score_answer with each problem's generated "
                         "entry, which a data row cannot carry: its prompts cannot be written as data rows")

    def score(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Outcome]:
        return [self._judge(p, c) for p, c in zip(problems, completions, strict=True)]

    def _judge(self, problem: Problem, completion: str) -> GymOutcome:
        if not isinstance(problem, GymProblem):
            raise TypeError(f"task {self.name!r} scores its own problems (GymProblem), got {type(problem).__name__}")

        def outcome(verdict: Verdict, detail: str, score: float = 0.0) -> GymOutcome:
            return GymOutcome(verdict, detail, self.name, str(self.version), score=score)

        answer = extract_answer(completion, self.answer_rule)
        if not answer:
            what = "has no number" if self.answer_rule == "last_number" else "is empty"
            return outcome(Verdict.PARSE_ERROR, f"no answer: the completion (or its last <answer>) {what}")
        shown = repr(answer[:DETAIL_ANSWER_CHARS]) + ("…" if len(answer) > DETAIL_ANSWER_CHARS else "")
        try:
            score = float(self._generator(problem.draw).score_answer(answer, self._entry(problem.draw, problem.entry)))
        except Exception as e:  # the dataset's scorer could not judge this answer
            return outcome(Verdict.INTERNAL_ERROR, f"score_answer raised {_line(e)} on {shown}")
        if not 0.0 <= score <= 1.0:  # NaN included
            return outcome(Verdict.INTERNAL_ERROR, f"score_answer gave {score!r}, outside [0, 1], for {shown}")
        return outcome(Verdict.AC if score == 1.0 else Verdict.WA, f"{shown} scores {score:.6g}", score)

    def reward(self, outcome: Outcome) -> float:
        """Partial credit: the dataset's score of the answer."""
        return outcome.score if isinstance(outcome, GymOutcome) else outcome.reward
