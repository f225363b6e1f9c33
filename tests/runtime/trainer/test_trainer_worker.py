"""The trainer worker re-derives the small run's versions, with and without its parent cache.

With ``keep_parents`` (the run's ``max_staleness``) the parents it trained from serve the next
steps' old log-probs, so it reads no version from the parameter store; without, it reads each
one back. Both give the digests the run logged, step by step, on a fresh store.
"""

from __future__ import annotations

import pytest

from ledger import events as ev
from ledger import open_store
from runtime.config import Config
from runtime.controller.workers import TrainRollout, TrainTask
from runtime.params import ParamStore
from runtime.session import build_session
from runtime.workers import StepTrainer


class CountingStore(ParamStore):
    """A real parameter store that counts the versions read back."""

    reads = 0

    def get(self, version, *args, **kwargs):
        CountingStore.reads += 1
        return super().get(version, *args, **kwargs)


@pytest.mark.parametrize("keep_parents", [1, 0])
def test_the_trainer_re_derives_every_logged_version(small_run, tmp_path, keep_parents):
    out, _, _ = small_run
    with open_store(out) as store:
        events = [s.event for s in store.read("run")]
    config = Config.from_dict(events[0].config)
    assert config.scheduling.max_staleness == 1 and config.trainer.shared_prefix is True
    session = build_session(config, log=lambda m: None, judge=False, engine=False)
    requests = {q.rollout_id: q for e in events if isinstance(e, ev.RolloutRequested) for q in e.samples()}
    done = {e.rollout_id: e for e in events if isinstance(e, ev.RolloutCompleted)}
    outcomes = {e.rollout_id: e for e in events if isinstance(e, ev.OutcomeRecorded)}
    logged = {e.version: e.digest for e in events if isinstance(e, ev.WeightsPublished)}
    store = CountingStore.open(str(tmp_path / "params"), create=True)
    trainer = StepTrainer("t", session.model, session.task, session.codec, store, session.step_config,
                          group_size=config.sampling.group_size, width=session.width, keep_parents=keep_parents)
    CountingStore.reads = 0
    assert trainer.initialize(None).digest == logged[0]
    read = 0
    for b in (e for e in events if isinstance(e, ev.BatchFormed)):
        rollouts = tuple(TrainRollout(requests[r], done[r], outcomes[r]) for r in b.rollout_ids)
        older = {r.completion.policy_version for r in rollouts} - {b.step - 1}
        read += bool(older - {0})  # version 0 is the worker's reference copy
        _, published = trainer.train(TrainTask(b.step, b.step - 1, logged[b.step - 1], b, rollouts))
        assert published.digest == logged[b.step], f"step {b.step}"
    assert read >= 1  # some step needed an older version than 0 for its old log-probs
    assert CountingStore.reads == (0 if keep_parents else read)
