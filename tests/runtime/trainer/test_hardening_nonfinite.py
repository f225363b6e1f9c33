"""The trainer publishes no version with a NaN or an infinity in it.

Before the front checked token ids, one completion with an id outside the vocabulary reached the
trainer and made every parameter NaN from step 1 on (the embedding's gather reads NaN out of
range), and the run still ended "completed". The trainer now refuses such a step in one line
naming it, and puts nothing into the parameter store. The batch is the controller's own hand-out
of a tiny real model's run; only the poisoned completion bypasses the front.
"""

from __future__ import annotations

import numpy as np
import pytest

from ledger import events as ev
from ledger import open_store
from runtime.config import load_config
from runtime.controller import ControllerLoop
from runtime.controller.workers import INFERENCE, TRAINER, VERIFIER, InitTask, TrainTask
from runtime.params import ParamStore
from runtime.session import build_session, make_trainer, resolve
from runtime.workers.trainer import NonFiniteWeights, nonfinite_leaves

TINY = ["run.steps=1", "pretrain.steps=0", "sampling.group_size=2", "scheduling.groups_per_batch=1",
        "sampling.max_tokens=4", "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2",
        "model.num_kv_heads=1", "model.intermediate_size=32", "trainer.learning_rate=1e-2"]


@pytest.fixture(scope="module")
def session():
    config = load_config(None, TINY)
    from runtime.session import make_task

    config = resolve(config, make_task(config))
    return build_session(config, log=lambda m: None, judge=False, warm=False, engine=False)


def step_one(session, tmp_path, token: int):
    """The trainer and the controller's task for step 1, whose first completion ends in ``token``."""
    config = session.config
    pstore = ParamStore.open(str(tmp_path / "params"), create=True)
    trainer = make_trainer(session, pstore, "t")
    loop = ControllerLoop.create(open_store("memory://"), run_id="r", config=config.to_dict(),
                                 config_digest=config.digest(), seed=config.run.seed)
    for wid, role in (("a", INFERENCE), ("v", VERIFIER), ("t", TRAINER)):
        loop.join(wid, role, slots=2)
    assert isinstance(loop.train_task("t"), InitTask)
    assert all(v.accepted for v in loop.publish([trainer.initialize(InitTask())], worker_id="t"))
    leases = loop.leases("a")
    done = [ev.RolloutCompleted(q.rollout_id, "a", q.attempt, q.policy_version, q.weights_digest,
                                np.array([5, token if i == 0 else 6], np.int32), np.array([-1.0, -1.0], np.float32),
                                "stop") for i, q in enumerate(leases)]
    assert all(v.accepted for v in loop.complete(done))  # the loop itself does not check values
    outcomes = [ev.OutcomeRecorded(t.rollout_id, float(i), bool(i), "AC" if i else "WA", "math", "1")
                for i, t in enumerate(loop.scoring_work("v", 8))]
    assert all(v.accepted for v in loop.record_outcomes(outcomes))
    task = loop.train_task("t")
    assert isinstance(task, TrainTask) and task.step == 1
    return trainer, pstore, task


def test_a_step_that_makes_non_finite_weights_is_not_published(session, tmp_path):
    trainer, pstore, task = step_one(session, tmp_path, token=10**6)  # far outside the 63-token vocabulary
    with pytest.raises(NonFiniteWeights) as raised:
        trainer.train(task)
    message = str(raised.value)
    assert message.startswith("step 1 made non-finite weights (NaN or inf in ")
    assert message.endswith("): version 1 is not published and the run stops; `rlx audit step 1` shows the batch "
                            "it was trained on")
    assert "\n" not in message
    assert pstore.versions() == (0,) or list(pstore.versions()) == [0]


def test_an_honest_step_is_published(session, tmp_path):
    trainer, pstore, task = step_one(session, tmp_path, token=7)
    step, weights = trainer.train(task)
    assert (step.step, weights.version) == (1, 1)
    assert 1 in pstore.versions() and pstore.digest(1) == weights.digest


def test_nonfinite_leaves_names_each_leaf():
    params = {"a": np.ones(3, np.float32), "b": {"c": np.array([1.0, np.inf], np.float32),
                                                  "d": np.array([np.nan], np.float32)}, "e": np.arange(3)}
    assert nonfinite_leaves(params) == ["b/c", "b/d"]
    assert nonfinite_leaves({"a": np.zeros(2, np.float32)}) == []
