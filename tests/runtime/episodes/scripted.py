"""A scripted policy: the model's turns given as text, encoded once into the ids it 'samples'."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from runtime.episodes import ToolResult
from runtime.tasks.base import TextCodec


def action_ids(codec: TextCodec, text: str, *, stop: bool = True) -> list[int]:
    """``text``'s ids, ended by the codec's first stop id unless ``stop`` is False (cut at max_tokens)."""
    return codec.tokenizer.encode(text, add_special_tokens=False).ids + ([codec.eos_ids[0]] if stop else [])


class Scripted:
    """Plays ``texts`` one per turn; each sampled id gets a distinct log-prob."""

    def __init__(self, codec: TextCodec, texts: Sequence[str], *, stop: bool = True):
        self.actions = [action_ids(codec, t, stop=stop) for t in texts]
        self.contexts: list[np.ndarray] = []

    def __call__(self, context: np.ndarray, turn: int) -> tuple[list[int], np.ndarray]:
        assert turn == len(self.contexts)
        self.contexts.append(context)
        ids = self.actions[turn]
        return ids, -np.arange(1, len(ids) + 1, dtype=np.float32) / 8


class NoTool:
    """Stands in for a tool that is unavailable: running it fails the test."""

    name = "calculator"

    def describe(self) -> dict:
        return {"name": self.name}

    def run(self, arguments: str) -> ToolResult:
        raise AssertionError("a replay ran a tool")
