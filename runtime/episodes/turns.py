"""The ids an environment appends between turns, made with the model's own tokenizer and template.

Token in, token out: the model's sampled ids are kept as they are; the environment only appends.
With a chat template (``ChatTurns``) the appended text is what the template renders between the
end of the assistant's message and the opening of its next one, for the tool's result as a
message of ``role``. It is found by rendering the prompt's messages, an assistant message whose
content is a sentinel, and the result message: the text after the sentinel is the template's own
closing of the assistant message, the result message with its role markers, and the generation
prompt. If the model ended its turn with a stop token whose text opens that suffix (``<|im_end|>``
for ChatML), that part is already in the episode and is not appended again; a turn cut at
``max_tokens`` gets the whole suffix. Only the suffix is tokenized, on its own, so nothing the
model sampled is ever re-encoded.

Without a template (``PlainTurns``, the built-in character model) the result is appended as
``prefix + result + suffix``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from runtime.episodes.episode import EpisodeError
from runtime.tasks.base import Problem, TextCodec

Action = Sequence[int] | np.ndarray
"""One turn's sampled ids."""
SENTINEL = "\u0000rlx-assistant-turn\u0000"


class TurnFormat(Protocol):
    """How an environment turns text into the ids it appends, for one model's tokenizer."""

    @property
    def codec(self) -> TextCodec: ...

    def prompt_ids(self, problem: Problem) -> np.ndarray: ...

    def result_ids(self, problem: Problem, action: Action, text: str) -> np.ndarray: ...

    def decode(self, action: Action) -> str: ...


def _encode(codec: TextCodec, text: str) -> np.ndarray:
    return np.asarray(codec.tokenizer.encode(text, add_special_tokens=False).ids, np.int32)


def _decode(codec: TextCodec, action: Action) -> str:
    """The action's text up to its first stop id (what a tool-call rule reads)."""
    return codec.decode(action)


@dataclasses.dataclass(frozen=True)
class ChatTurns:
    """Turn boundaries rendered by the checkpoint's chat template.

    Attributes:
      codec: a ``TextCodec`` with a chat template.
      role: the role of a tool result's message (``"tool"``; ``"user"`` for a template that
        refuses other roles).
    """

    codec: TextCodec
    role: str = "tool"

    def __post_init__(self) -> None:
        if self.codec.template is None:
            raise EpisodeError("ChatTurns needs a codec with a chat template; use PlainTurns without one")

    def prompt_ids(self, problem: Problem) -> np.ndarray:
        return self.codec.encode_prompt(problem)

    def decode(self, action: Action) -> str:
        return _decode(self.codec, action)

    def suffix_text(self, problem: Problem, text: str) -> str:
        """The template's text from the end of an assistant message's content to the opening of
        the next assistant message, with ``text`` as a ``role`` message in between."""
        messages = [{"role": r, "content": c} for r, c in (problem.messages or (("user", problem.prompt),))]
        messages += [{"role": "assistant", "content": SENTINEL}, {"role": self.role, "content": text}]
        rendered = self.codec.template.render(messages)
        if rendered.count(SENTINEL) != 1:
            raise EpisodeError("the chat template did not render the assistant's message as it was given: "
                               "its turn boundaries cannot be found")
        return rendered.split(SENTINEL, 1)[1]

    def result_ids(self, problem: Problem, action: Action, text: str) -> np.ndarray:
        suffix = self.suffix_text(problem, text)
        ids = [int(t) for t in action]
        if ids and ids[-1] in self.codec.eos_ids:
            stop = self.codec.tokenizer.decode([ids[-1]], skip_special_tokens=False)
            if stop and suffix.startswith(stop):
                suffix = suffix[len(stop):]
        return _encode(self.codec, suffix)


@dataclasses.dataclass(frozen=True)
class PlainTurns:
    """Turn boundaries of a model without a chat template: ``prefix + result + suffix``."""

    codec: TextCodec
    prefix: str = "\n<result>"
    suffix: str = "</result>\n"

    def prompt_ids(self, problem: Problem) -> np.ndarray:
        return self.codec.encode_prompt(problem)

    def decode(self, action: Action) -> str:
        return _decode(self.codec, action)

    def result_ids(self, problem: Problem, action: Action, text: str) -> np.ndarray:
        return _encode(self.codec, self.prefix + text + self.suffix)


def turn_format(codec: TextCodec) -> TurnFormat:
    """``ChatTurns`` for a codec with a chat template, else ``PlainTurns``."""
    return ChatTurns(codec) if codec.template is not None else PlainTurns(codec)
