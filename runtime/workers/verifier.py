"""The verifier worker: scores completed rollouts with the task's verifier. Stateless."""

from __future__ import annotations

from collections.abc import Sequence

from ledger.events import OutcomeRecorded
from runtime.controller.workers import ScoreTask
from runtime.episodes.rollout import final_ids
from runtime.tasks.base import Task, TextCodec


class TaskVerifier:
    """Decodes each completion (a multi-turn episode's last turn), re-derives its problem from the
    prompt index, and verifies it."""

    def __init__(self, worker_id: str, task: Task, codec: TextCodec):
        self.worker_id = worker_id
        self.task = task
        self.codec = codec

    def score(self, tasks: Sequence[ScoreTask]) -> list[OutcomeRecorded]:
        problems = [self.task.problem("train", t.prompt_index) for t in tasks]
        # a multi-turn episode is scored on its last turn (``final_ids``: the whole completion otherwise)
        texts = [self.codec.decode(final_ids(t.completion.tokens, t.completion.turns)) for t in tasks]
        outcomes = self.task.score(problems, texts)
        return [OutcomeRecorded.of(t.rollout_id, o, self.task.reward(o)) for t, o in zip(tasks, outcomes, strict=True)]
