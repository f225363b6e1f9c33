"""An episode as a value: its prompt ids, then per turn the model's sampled ids and log-probs and
the ids the environment appended after them, and the tool call of the turn.

``Episode.row()`` is the training row: exactly the concatenation of the recorded ids, with a mask
that is True on the model's sampled ids and nowhere else (prompt, role markers, tool results are
context, never trained), and the behaviour log-probs aligned to it (0 where the mask is False).
Nothing is re-tokenized: the row is built from the ids as they were sampled and appended.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from runtime.episodes.tools import ToolCall
from runtime.errors import RlxError


class EpisodeError(RlxError):
    """Base of the episodes package's errors."""


def _ids(values: Sequence[int] | np.ndarray) -> np.ndarray:
    ids = np.asarray(values, np.int32).reshape(-1)
    ids.setflags(write=False)
    return ids


@dataclasses.dataclass(frozen=True, eq=False)
class Turn:
    """One turn: what the model sampled, and what the environment appended after it.

    Attributes:
      sampled: int32 ``[n]`` the model's sampled ids (its stop id, if any, the last one).
      logprobs: float32 ``[n]`` their behaviour log-probs.
      appended: int32 ``[m]`` the ids the environment appended (tool result, role markers); empty
        after the final turn.
      call: the turn's tool call, or None (the final answer).
    """

    sampled: np.ndarray
    logprobs: np.ndarray
    appended: np.ndarray
    call: ToolCall | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sampled", _ids(self.sampled))
        logprobs = np.asarray(self.logprobs, np.float32).reshape(-1)
        logprobs.setflags(write=False)
        object.__setattr__(self, "logprobs", logprobs)
        object.__setattr__(self, "appended", _ids(self.appended))
        if self.logprobs.shape != self.sampled.shape:
            raise EpisodeError(f"a turn has {self.sampled.size} sampled ids but {self.logprobs.size} log-probs")

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Turn) and np.array_equal(self.sampled, other.sampled)
                and self.logprobs.tobytes() == other.logprobs.tobytes()
                and np.array_equal(self.appended, other.appended) and self.call == other.call)

    __hash__ = None  # type: ignore[assignment]


@dataclasses.dataclass(frozen=True)
class Row:
    """An episode's training row.

    Attributes:
      ids: int32 ``[L]`` prompt, then each turn's sampled and appended ids.
      mask: bool ``[L]`` True exactly on the model's sampled ids.
      logprobs: float32 ``[L]`` behaviour log-probs where ``mask``, 0 elsewhere.
      prompt_len: ids of the prompt (the first observation).
    """

    ids: np.ndarray
    mask: np.ndarray
    logprobs: np.ndarray
    prompt_len: int


@dataclasses.dataclass(frozen=True, eq=False)
class Episode:
    """The turns of one rollout so far (a value: ``add`` returns a new episode).

    Attributes:
      prompt: int32 the first observation's ids.
      turns: the turns so far.
      reward: the final reward, once the episode is done (None before).
    """

    prompt: np.ndarray
    turns: tuple[Turn, ...] = ()
    reward: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt", _ids(self.prompt))
        object.__setattr__(self, "turns", tuple(self.turns))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Episode) and np.array_equal(self.prompt, other.prompt)
                and self.turns == other.turns and self.reward == other.reward)

    __hash__ = None  # type: ignore[assignment]

    @property
    def done(self) -> bool:
        return self.reward is not None

    def add(self, turn: Turn) -> Episode:
        """This episode with ``turn`` appended."""
        if self.done:
            raise EpisodeError("a finished episode takes no more turns")
        return dataclasses.replace(self, turns=(*self.turns, turn))

    def finish(self, reward: float) -> Episode:
        """This episode, done, with its final ``reward``."""
        return dataclasses.replace(self, reward=float(reward))

    def context(self) -> np.ndarray:
        """Every id so far: what the engine continues from for the next turn."""
        return self.row().ids

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        """The tool calls of the episode, in order."""
        return tuple(t.call for t in self.turns if t.call is not None)

    def row(self) -> Row:
        """The training row: the concatenation of the recorded ids, the sampled-token mask and
        the behaviour log-probs aligned to it."""
        ids, mask, logprobs = [self.prompt], [np.zeros(self.prompt.size, bool)], [np.zeros(self.prompt.size, np.float32)]
        for turn in self.turns:
            ids += [turn.sampled, turn.appended]
            mask += [np.ones(turn.sampled.size, bool), np.zeros(turn.appended.size, bool)]
            logprobs += [turn.logprobs, np.zeros(turn.appended.size, np.float32)]
        return Row(np.concatenate(ids).astype(np.int32), np.concatenate(mask), np.concatenate(logprobs).astype(np.float32),
                   int(self.prompt.size))
