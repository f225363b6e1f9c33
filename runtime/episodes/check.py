"""Every trained row of a multi-turn run against its record: the ids and mask the trainer packed
for each step, beside the ids the ledger recorded and the environment re-derives.

For each train step of the run, the batch is packed again as the trainer packs it
(``StepTrainer.prepare`` on the step's logged rollouts), and each row is compared with the
prompt followed by every turn's sampled ids and the ids the environment appends after them,
re-derived from the sampled ids and the recorded tool results (``rollout.rederive``; no tool
runs). A row is *equal* when its ids are exactly those, nothing follows them, its mask is True on
the model's sampled ids and nowhere else, and its behaviour log-probs are the engine's on those
ids.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from runtime.episodes.episode import EpisodeError
from runtime.episodes.rollout import rederive


@dataclasses.dataclass(frozen=True)
class RowsCheck:
    """What ``check_rows`` found.

    Attributes:
      rows: trained rows checked (one per rollout of every step's batch).
      equal: rows equal to their record.
      turns: turns of those episodes.
      calls: tool calls of those episodes.
      first_difference: the first row that is not equal (``step S row B: why``), or None.
    """

    rows: int
    equal: int
    turns: int
    calls: int
    first_difference: str | None


def check_rows(store, run_id: str) -> RowsCheck:
    """Check every trained row of run ``run_id`` in ``store`` (see the module docstring)."""
    from ledger import events as ev
    from runtime.config import Config
    from runtime.params import ParamStore
    from runtime.replay.plan import StepPlan, index_run, stream_replay
    from runtime.session import build_session, make_trainer

    started = next(s.event for s in store.read(run_id) if type(s.event) is ev.RunStarted)
    config = Config.from_dict(started.config)
    session = build_session(config, log=lambda m: None, warm=False, engine=False, judge=False)
    trainer = make_trainer(session, ParamStore.open("memory://rows-check/"), "rows-check", replay=True)
    env = session.task.environment(session.codec, tools={})
    index = index_run(store.read(run_id))
    rows = equal = turns = calls = 0
    first = None
    for plan in stream_replay(store.read(run_id), index, start=0, sampled=False):
        if not isinstance(plan, StepPlan):
            continue
        batch = trainer.prepare(plan.task)[0]
        for b, r in enumerate(plan.task.rollouts):
            c = r.completion
            rows += 1
            turns += len(c.turns)
            calls += sum(t["call"] is not None for t in c.turns)
            problem = session.task.problem("train", r.request.prompt_index)
            prompt = session.codec.encode_prompt(problem)
            try:
                episode = rederive(env, problem, prompt, c.tokens, c.logprobs, c.turns, config.max_tokens)
            except EpisodeError as e:
                first = first or f"step {plan.step} row {b}: {e}"
                continue
            row = episode.row()  # the prompt, each turn's sampled and appended ids; the model's ids masked
            n = row.ids.size
            why = None
            if not (np.array_equal(batch.tokens_BT[b, :n], row.ids) and not batch.attention_BT[b, n:].any()):
                why = "its ids are not the recorded ids"
            elif not (np.array_equal(batch.mask_BS[b, : n - 1], row.mask[1:]) and not batch.mask_BS[b, n - 1 :].any()):
                why = "its mask is not the model's ids"
            elif batch.behaviour_BS[b, : n - 1][row.mask[1:]].tobytes() != row.logprobs[row.mask].tobytes():
                why = "its behaviour log-probs are not the recorded ones"
            if why is None:
                equal += 1
            else:
                first = first or f"step {plan.step} row {b}: {why}"
    return RowsCheck(rows, equal, turns, calls, first)


__all__ = ["RowsCheck", "check_rows"]
