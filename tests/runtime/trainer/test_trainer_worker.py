"""The trainer worker re-derives the small run's versions, and its old log-probs' two sources.

The small run takes its old log-probs from the engine (``trainer.old_logprobs = "behaviour"``, a
float32 model's default): the worker re-derives every logged digest on a fresh store without
reading a version back. Recomputing them instead (``"recompute"``) scores older rows with their
version's weights: with ``keep_parents`` (the run's ``max_staleness``) the parents it trained from
serve the next steps, so it reads no version from the parameter store; without, it reads each one
back; both give the same digests, step by step.
"""

from __future__ import annotations

import dataclasses

import pytest

from ledger import events as ev
from ledger import open_store
from runtime.config import Config
from runtime.controller.workers import TrainRollout, TrainTask
from runtime.params import ParamStore, ParamStoreError
from runtime.session import build_session
from runtime.workers import StepTrainer


class CountingStore(ParamStore):
    """A real parameter store that counts the versions read back."""

    reads = 0

    def get(self, version, *args, **kwargs):
        CountingStore.reads += 1
        return super().get(version, *args, **kwargs)


def _logged(small_run):
    out, _, _ = small_run
    with open_store(out) as store:
        events = [s.event for s in store.read("run")]
    config = Config.from_dict(events[0].config)
    assert config.scheduling.max_staleness == 1 and config.trainer.shared_prefix is True
    return events, config


def _derive(events, config, store, keep_parents, store_opt_state=True):
    """Re-run every logged batch with a fresh worker; the digest of each version, and how many
    steps needed a version other than their parent and 0 for old log-probs."""
    session = build_session(config, log=lambda m: None, judge=False, engine=False)
    requests = {q.rollout_id: q for e in events if isinstance(e, ev.RolloutRequested) for q in e.samples()}
    done = {e.rollout_id: e for e in events if isinstance(e, ev.RolloutCompleted)}
    outcomes = {e.rollout_id: e for e in events if isinstance(e, ev.OutcomeRecorded)}
    trainer = StepTrainer("t", session.model, session.task, session.codec, store, session.step_config,
                          group_size=config.sampling.group_size, width=session.width, keep_parents=keep_parents,
                          store_opt_state=store_opt_state)
    digests = {0: trainer.initialize(None).digest}
    older_steps = 0
    for b in (e for e in events if isinstance(e, ev.BatchFormed)):
        rollouts = tuple(TrainRollout(requests[r], done[r], outcomes[r]) for r in b.rollout_ids)
        older = {r.completion.policy_version for r in rollouts} - {b.step - 1}
        older_steps += bool(older - {0})  # version 0 is the worker's reference copy
        _, published = trainer.train(TrainTask(b.step, b.step - 1, digests[b.step - 1], b, rollouts))
        digests[b.step] = published.digest
    return digests, older_steps


def test_the_trainer_re_derives_every_logged_version_from_the_engines_log_probs(small_run, tmp_path):
    events, config = _logged(small_run)
    assert config.trainer.old_logprobs == "behaviour"
    logged = {e.version: e.digest for e in events if isinstance(e, ev.WeightsPublished)}
    store = CountingStore.open(str(tmp_path / "params"), create=True)
    CountingStore.reads = 0
    digests, older_steps = _derive(events, config, store, keep_parents=1)
    assert digests == logged
    assert older_steps >= 1 and CountingStore.reads == 0


def test_recomputed_old_log_probs_come_from_the_parent_cache_or_the_store_alike(small_run, tmp_path):
    events, config = _logged(small_run)
    config = dataclasses.replace(config, trainer=dataclasses.replace(config.trainer, old_logprobs="recompute"))
    derived, reads = [], []
    for keep_parents in (1, 0):
        store = CountingStore.open(str(tmp_path / f"params{keep_parents}"), create=True)
        CountingStore.reads = 0
        digests, older_steps = _derive(events, config, store, keep_parents)
        derived.append(digests)
        reads.append((CountingStore.reads, older_steps))
    assert derived[0] == derived[1]
    (cached_reads, older_steps), (store_reads, _) = reads
    assert older_steps >= 1  # some step needed an older version than 0 for its old log-probs
    assert cached_reads == 0 and store_reads == older_steps


def test_a_trainer_that_stores_no_optimizer_state_trains_on_from_the_state_it_holds(small_run, tmp_path):
    # A replay's trainer: versions published with their parameters only, the same digests, the
    # old log-probs of older rows recomputed from those parameters read back.
    events, config = _logged(small_run)
    logged = {e.version: e.digest for e in events if isinstance(e, ev.WeightsPublished)}
    config = dataclasses.replace(config, trainer=dataclasses.replace(config.trainer, old_logprobs="recompute"))
    store = CountingStore.open(str(tmp_path / "params"), create=True)
    CountingStore.reads = 0
    digests, older_steps = _derive(events, config, store, keep_parents=0, store_opt_state=False)
    assert digests == _derive(events, config, ParamStore.open("memory://opt-kept/"), keep_parents=0)[0]
    assert older_steps >= 1 and CountingStore.reads == older_steps
    assert set(digests) == set(logged)
    for version in store.versions():
        assert store.digest(version) == digests[version]
        with pytest.raises(ParamStoreError, match="without optimizer state"):
            store.get_opt_state(version)
