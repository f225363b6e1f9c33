"""The inference engine as an episode's policy: each turn continues from the episode's ids.

``EnginePolicy`` hands the engine the episode's ids so far (``Episode.context()``: the prompt, every
sampled id and every appended id, never re-tokenized text) and returns the turn's sampled ids and
their behaviour log-probs as the engine computed them: the prompt is prefilled and the ids after
it are fed through the decode step (``Engine.generate``'s ``feeds``), which is how the engine
builds every episode's cache, so this policy's turns are those ``rollout.EpisodeSampler`` samples
keeping the episode's KV pages between turns, bit for bit. A turn's seed is a pure function of the
rollout's seed and the turn's index (``turn_seed``), so a re-issued episode regenerates the same
turns; the engine's batch invariance makes the rest of a turn independent of whatever else it
decodes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from runtime import rng
from runtime.episodes.episode import EpisodeError


def turn_seed(rollout_seed: int, turn: int) -> int:
    """The sampling seed of turn ``turn`` (0-based) of the episode whose rollout seed is ``rollout_seed``."""
    return rng.derive_seed(rollout_seed, rng.EPISODE_TURN, turn)


@dataclasses.dataclass(frozen=True)
class EnginePolicy:
    """One episode's turns sampled by an engine.

    Attributes:
      engine: a ``runtime.inference.Engine``.
      params: the ``SamplingParams`` of every turn (``max_tokens`` bounds one turn).
      seed: the rollout's seed.
      prompt_len: ids of the episode's prompt (the first observation): the engine prefills those
        and feeds the rest.
    """

    engine: Any
    params: Any
    seed: int
    prompt_len: int

    def __call__(self, context: np.ndarray, turn: int) -> tuple[np.ndarray, np.ndarray]:
        context = np.asarray(context, np.int32)
        if not 0 < self.prompt_len <= context.size:
            raise EpisodeError(f"turn {turn}: the episode has {context.size} ids, fewer than its prompt's "
                               f"{self.prompt_len}")
        longest = self.engine.max_seq_len - self.params.max_tokens
        if context.size > longest:
            raise EpisodeError(f"turn {turn}: the episode has {context.size} ids, more than the {longest} the engine "
                               f"can continue from with {self.params.max_tokens} new tokens")
        (completion,) = self.engine.generate([context[: self.prompt_len]], self.params, [turn_seed(self.seed, turn)],
                                             feeds=[context[self.prompt_len:]])
        return completion.tokens, completion.logprobs
