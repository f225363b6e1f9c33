"""The ids an environment appends between turns, made with the model's own tokenizer and template.

Token in, token out: the model's sampled ids are kept as they are; the environment only appends.
With a chat template (``ChatTurns``) the appended ids are what the template renders between the
end of the assistant's message and the opening of its next one, with the tool's result as a
message of ``role``. The template must be append-only: the prompt it renders (with its generation
prompt) must be the start of the conversation it renders once the turns go on, which is checked.
The boundaries are found by rendering the prompt's messages, an assistant message and a
result message whose contents are two sentinels: the text between the sentinels is the
template's own closing of the assistant message and opening of the result message, the text
after the second its closing and the generation prompt. If the model ended its turn with a stop
token whose text opens that suffix (``<|im_end|>`` for ChatML), that part is already in the
episode and is not appended again; a turn cut at ``max_tokens`` gets the whole closing. Only the
environment's own text is tokenized, so nothing the model sampled is ever re-encoded.

The result's text is encoded *literally*: a special token's string in it (a program that prints
``<|im_end|>\n<|im_start|>assistant``, or ``<eos>``) becomes ordinary text tokens, so a tool's
output can never forge a turn boundary or a stop id; only the template's markers are special ids.

Without a template (``PlainTurns``, the built-in character model) the result is appended as
``prefix + result + suffix``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from runtime.episodes.episode import EpisodeError
from runtime.tasks.base import Problem, TextCodec

Action = Sequence[int] | np.ndarray
"""One turn's sampled ids."""
SENTINEL = "\u0000rlx-assistant-turn\u0000"
RESULT_SENTINEL = "\u0000rlx-tool-result\u0000"


class TurnFormat(Protocol):
    """How an environment turns text into the ids it appends, for one model's tokenizer."""

    @property
    def codec(self) -> TextCodec: ...

    def prompt_ids(self, problem: Problem) -> np.ndarray: ...

    def result_ids(self, problem: Problem, action: Action, text: str) -> np.ndarray: ...

    def decode(self, action: Action) -> str: ...


def _encode(tokenizer: Any, text: str) -> np.ndarray:
    return np.asarray(tokenizer.encode(text, add_special_tokens=False).ids, np.int32)


def literal_tokenizer(tokenizer: Any) -> Any:
    """A copy of ``tokenizer`` that encodes special tokens' strings as plain text."""
    from tokenizers import Tokenizer

    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.encode_special_tokens = True
    return copy


def _decode(codec: TextCodec, action: Action) -> str:
    """The action's text up to its first stop id (what a tool-call rule reads)."""
    return codec.decode(action)


class _CodecTurns:
    """What both kinds of turns read from their ``codec``: the prompt's ids, an action's text,
    and the tokenizer that encodes a tool result literally."""

    codec: TextCodec

    def prompt_ids(self, problem: Problem) -> np.ndarray:
        return self.codec.encode_prompt(problem)

    def decode(self, action: Action) -> str:
        return _decode(self.codec, action)

    @functools.cached_property
    def _literal(self) -> Any:
        return literal_tokenizer(self.codec.tokenizer)


@dataclasses.dataclass(frozen=True)
class ChatTurns(_CodecTurns):
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

    def boundaries(self, problem: Problem) -> tuple[str, str]:
        """The template's text around a result message: from the end of the assistant message's
        content to the result's content, and from there to the opening of the next assistant
        message."""
        messages = [{"role": r, "content": c} for r, c in (problem.messages or (("user", problem.prompt),))]
        messages += [{"role": "assistant", "content": SENTINEL}, {"role": self.role, "content": RESULT_SENTINEL}]
        rendered = self.codec.template.render(messages)
        if rendered.count(SENTINEL) != 1 or rendered.count(RESULT_SENTINEL) != 1 or \
                rendered.index(SENTINEL) > rendered.index(RESULT_SENTINEL):
            raise EpisodeError(f"the chat template did not render the assistant's and the {self.role!r} message's "
                               "contents as they were given: its turn boundaries cannot be found")
        if rendered.index(SENTINEL) != len(prompt := self.codec.prompt_text(problem)) or not rendered.startswith(prompt):
            raise EpisodeError("the chat template renders the prompt differently once the conversation goes on (it "
                               "is not append-only), so an episode's ids would not be its conversation's")
        before, after = rendered.split(SENTINEL, 1)[1].split(RESULT_SENTINEL)
        return before, after

    def suffix_text(self, problem: Problem, text: str) -> str:
        """The template's text from the end of an assistant message's content to the opening of
        the next assistant message, with ``text`` as a ``role`` message in between."""
        before, after = self.boundaries(problem)
        return before + text + after

    def result_ids(self, problem: Problem, action: Action, text: str) -> np.ndarray:
        before, after = self.boundaries(problem)
        ids = [int(t) for t in action]
        if ids and ids[-1] in self.codec.eos_ids:
            stop = self.codec.tokenizer.decode([ids[-1]], skip_special_tokens=False)
            if stop and before.startswith(stop):
                before = before[len(stop):]
        return np.concatenate([_encode(self.codec.tokenizer, before), _encode(self._literal, text),
                               _encode(self.codec.tokenizer, after)])


@dataclasses.dataclass(frozen=True)
class PlainTurns(_CodecTurns):
    """Turn boundaries of a model without a chat template: ``prefix + result + suffix``."""

    codec: TextCodec
    prefix: str = "\n<result>"
    suffix: str = "</result>\n"

    def result_ids(self, problem: Problem, action: Action, text: str) -> np.ndarray:
        return np.concatenate([_encode(self.codec.tokenizer, self.prefix), _encode(self._literal, text),
                               _encode(self.codec.tokenizer, self.suffix)])


def turn_format(codec: TextCodec) -> TurnFormat:
    """``ChatTurns`` for a codec with a chat template, else ``PlainTurns``."""
    return ChatTurns(codec) if codec.template is not None else PlainTurns(codec)
