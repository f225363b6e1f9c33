"""The text behind a run's ids: prompts by index and completions by token ids.

The ledger logs prompt indices and token ids only; the run's logged config names the task and
the tokenizer that turn them back into text. :class:`RunText` rebuilds both from the config of
``RunStarted`` without loading any weights. Where a part cannot be rebuilt (a JSONL file or a
checkpoint that is gone), its text is None: ids stay the record.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.errors import RlxError


class RunText:
    """``prompt(index)`` and ``completion(token_ids)`` of a run, from its logged config."""

    def __init__(self, config: dict) -> None:
        from runtime.config import Config

        self._task = self._codec = None
        try:
            cfg = Config.from_dict(config)
        except RlxError:
            return
        try:
            from runtime.session import make_task

            self._task = make_task(cfg)
        except (RlxError, OSError):
            pass
        try:
            from runtime.session import build_codec

            self._codec = build_codec(cfg)
        except (RlxError, OSError, ValueError, KeyError):
            pass

    def prompt(self, index: int) -> str | None:
        return None if self._task is None else self._task.problem("train", index).prompt

    def completion(self, token_ids: Sequence[int]) -> str | None:
        """The text of ``token_ids``; None when an id is not one of the tokenizer's (negative, or
        beyond its vocabulary: a ledger written before submissions were checked may hold one)."""
        if self._codec is None or any(t < 0 for t in token_ids):
            return None
        try:
            return self._codec.decode(token_ids)
        except (OverflowError, ValueError, IndexError, KeyError):
            return None

    def ids(self, token_ids: Sequence[int]) -> str | None:
        """The text of ``token_ids`` with special tokens shown (an environment's role markers)."""
        if self._codec is None or any(t < 0 for t in token_ids):
            return None
        try:
            return self._codec.tokenizer.decode([int(t) for t in token_ids], skip_special_tokens=False)
        except (OverflowError, ValueError, IndexError, KeyError):
            return None

    def turns(self, tokens: Sequence[int], turns: Sequence[dict]) -> list[dict]:
        """A multi-turn completion turn by turn: what the model sampled, its tool call and what the
        environment appended, with their ids' counts and texts (None where the text cannot be rebuilt)."""
        from runtime.episodes.rollout import spans

        out = []
        for k, ((start, sampled_end, end), t) in enumerate(zip(spans(turns), turns, strict=True), 1):
            call = t["call"]
            out.append({
                "turn": k, "sampled": t["sampled"], "appended": t["appended"],
                "sampled_text": self.ids(tokens[start:sampled_end]), "appended_text": self.ids(tokens[sampled_end:end]),
                "call": None if call is None else {
                    "tool": call["tool"], "arguments": call["arguments"], "status": call["status"],
                    "exit_status": call["exit_status"], "wall_s": call["wall_s"], "truncated": call["truncated"],
                    "detail": call["detail"], "output": call["output"].decode("utf-8", "replace")},
            })
        return out

