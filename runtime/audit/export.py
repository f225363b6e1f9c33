"""``rlx ledger export`` with text: the prompt and completion of each rollout row, on the workers."""

from __future__ import annotations

from collections.abc import Iterator

import apache_beam as beam

from runtime.audit.text import RunText


class AddText(beam.DoFn):
    """Adds ``prompt`` and ``completion`` (text, or None where it cannot be rebuilt) to rollout
    rows; each worker rebuilds the task and tokenizer once from the run's logged config."""

    def __init__(self, config: dict) -> None:
        self.config = config
        self.text: RunText | None = None

    def setup(self) -> None:
        self.text = RunText(self.config)

    def process(self, row: dict) -> Iterator[dict]:
        assert self.text is not None  # Beam calls setup before process
        tokens = row["token_ids"]
        yield {**row, "prompt": self.text.prompt(row["prompt_index"]),
               "completion": None if tokens is None else self.text.completion(tokens)}
