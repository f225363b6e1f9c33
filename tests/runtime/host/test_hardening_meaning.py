"""Submissions are checked for meaning, not only type, and a train step is admitted with its weights.

The front refuses what the run's engine, verifier or trainer could not have produced: token ids
outside the model's vocabulary, more tokens than ``sampling.max_tokens``, a finish reason that
does not fit the length, non-finite or positive log-probs, rewards outside the tasks' range; and a
``TrainStepCompleted`` without its ``WeightsPublished`` (which left a run waiting for good), or
from a worker the step was not handed to. The same refusals come through the front directly and
over gRPC on loopback. ``rlx audit check`` names a ledger poisoned before these checks existed;
the host says when a run makes no progress, and what it waits for.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time

import numpy as np
import pytest

from ledger import events as ev
from ledger import open_store
from runtime.config import load_config
from runtime.controller import ControllerLoop
from runtime.controller.invariants import check
from runtime.controller.simulation import SimInference, SimTrainer, SimVerifier
from runtime.controller.workers import INFERENCE, TRAINER, VERIFIER, InitTask, TrainTask
from runtime.host import admission
from tests.runtime.host import hosting
from tests.runtime.host.hosting import refusal

VOCAB = 63  # the built-in character tokenizer's
MAX_TOKENS = 4
OVERRIDES = ["run.steps=2", "sampling.group_size=2", "scheduling.groups_per_batch=1", "scheduling.max_staleness=0",
             f"sampling.max_tokens={MAX_TOKENS}"]


@pytest.fixture
def hosted():
    with hosting.hosts(OVERRIDES, bounded=True) as make:
        yield make


def completion(lease, tokens, logprobs=None, finish="stop", worker="a") -> ev.RolloutCompleted:
    tokens = np.asarray(tokens, np.int32)
    logprobs = np.full(len(tokens), -0.5, np.float32) if logprobs is None else np.asarray(logprobs, np.float32)
    return ev.RolloutCompleted(lease.rollout_id, worker, lease.attempt, lease.policy_version, lease.weights_digest,
                               tokens, logprobs, finish)


def start(port) -> None:
    """Join an inference worker, a verifier and a trainer; publish version 0."""
    port.join("a", INFERENCE, slots=4)
    port.join("v", VERIFIER)
    port.join("t", TRAINER)
    assert isinstance(port.poll("t", wait_s=0).train, InitTask)
    published = SimTrainer("t", seed=1).initialize(InitTask())
    assert [v.accepted for v in port.submit("t", [published]).verdicts] == [True]


def values_scenario(h: hosting.Hosted) -> list:
    port = h.port
    start(port)
    leases = port.poll("a", wait_s=0).leases
    assert len(leases) == 2  # one group of two
    lease = leases[0]
    nan, inf = float("nan"), float("inf")
    bad_completions = [
        completion(lease, [-1, 7]),
        completion(lease, [5, 2**31 - 1]),
        completion(lease, [5, VOCAB]),
        completion(lease, [5, 7], [-0.5, nan]),
        completion(lease, [5, 7], [-inf, -0.5]),
        completion(lease, [5, 7], [-0.5, 0.25]),
        completion(lease, np.ones(100_000, np.int32)),
        completion(lease, [5, 7], finish="length"),
        completion(lease, []),
    ]
    head = h.head()
    transcript: list = [refusal(lambda e=e: port.submit("a", [e])) for e in bad_completions]
    transcript.append(h.head() == head)  # nothing refused was written
    good = [completion(leases[0], [5, VOCAB - 1], [-0.0, -3.0]),  # a log-prob of 0 (-0.0 too) is a certain token
            completion(leases[1], [1, 2, 3, 4], finish="length")]  # "length" at sampling.max_tokens
    transcript.append([v.accepted for v in port.submit("a", good).verdicts])
    tasks = port.poll("v", wait_s=0).scores
    assert sorted(t.rollout_id for t in tasks) == sorted(lease.rollout_id for lease in leases)
    rid = tasks[0].rollout_id
    bad_outcomes = [
        ev.OutcomeRecorded(rid, 1e39, False, "WA", "math", "1"),  # finite in float64, inf in float32
        ev.OutcomeRecorded(rid, 5.0, False, "WA", "math", "1"),
        ev.OutcomeRecorded(rid, -0.5, False, "WA", "math", "1"),
        ev.OutcomeRecorded(rid, 0.5, True, "AC", "math", "1"),
    ]
    head = h.head()
    transcript += [refusal(lambda e=e: port.submit("v", [e])) for e in bad_outcomes]
    transcript.append(h.head() == head)
    outcomes = [ev.OutcomeRecorded(rid, 0.5, False, "WA", "codefn", "1"),  # partial credit
                ev.OutcomeRecorded(tasks[1].rollout_id, 1.0, True, "AC", "math", "1")]
    transcript.append([v.accepted for v in port.submit("v", outcomes).verdicts])
    return transcript


def test_values_are_refused_alike_through_the_front_and_over_grpc(hosted):
    threads, grpc = values_scenario(hosted("threads")), values_scenario(hosted("grpc"))
    assert threads == grpc


def test_values_are_refused_with_their_reasons(hosted):
    t = values_scenario(hosted("threads"))
    completions, written, accepted = t[:9], t[9], t[10]
    outcomes, outcomes_written, outcomes_accepted = t[11:15], t[15], t[16]
    expected = [
        f"token 0 is id -1; accepted: ids in [0, {VOCAB}) (the model's vocabulary)",
        f"token 1 is id {2**31 - 1}; accepted: ids in [0, {VOCAB})",
        f"token 1 is id {VOCAB}; accepted",
        "token 1 has log-prob nan; a log-prob is finite and <= 0",
        "token 0 has log-prob -inf; a log-prob is finite and <= 0",
        "token 1 has log-prob 0.25",
        f"100000 tokens; sampling.max_tokens is {MAX_TOKENS}",
        f"finish reason 'length' after 2 tokens; it is given at sampling.max_tokens ({MAX_TOKENS}) only",
        "a completion has at least one token",
    ]
    for reason, text in zip(completions, expected, strict=True):
        assert reason.startswith("RolloutCompleted of rollout ") and text in reason, (reason, text)
    assert written is True and accepted == [True, True]
    expected = ["reward 1e+39 is not finite in float32", "reward 5.0 is outside the tasks' range [0.0, 1.0]",
                "reward -0.5 is outside the tasks' range", "a passed outcome earns reward 1.0, not 0.5"]
    for reason, text in zip(outcomes, expected, strict=True):
        assert reason.startswith("OutcomeRecorded of rollout ") and text in reason, (reason, text)
    assert outcomes_written is True and outcomes_accepted == [True, True]


def test_the_bounds_of_a_run_come_from_its_model_and_sampling():
    config = load_config(None, OVERRIDES, data_size=8)
    assert admission.bounds(config) == admission.Bounds(VOCAB, MAX_TOKENS, False)
    tools = load_config(None, [*OVERRIDES, 'episodes.tools=["calculator"]'], data_size=8)
    assert admission.bounds(tools) == admission.Bounds(VOCAB, MAX_TOKENS, True)


# -- a train step and its weights --------------------------------------------------------------------


def trained(task: TrainTask) -> list[ev.Event]:
    """The simulated trainer's result for ``task``, with its metrics as floats (as a real trainer's)."""
    step, weights = SimTrainer("t", seed=1).train(task)
    return [dataclasses.replace(step, metrics={k: float(v) for k, v in step.metrics.items()}), weights]


def to_step_one(port) -> TrainTask:
    """Complete and score batch 1 (rewards 1 and 0: not a uniform group); step 1 is handed to "t"."""
    start(port)
    leases = port.poll("a", wait_s=0).leases
    done = [completion(lease, [i + 1]) for i, lease in enumerate(leases)]
    assert all(v.accepted for v in port.submit("a", done).verdicts)
    tasks = port.poll("v", wait_s=0).scores
    outcomes = [ev.OutcomeRecorded(t.rollout_id, float(i == 0), i == 0, "AC" if i == 0 else "WA", "math", "1")
                for i, t in enumerate(tasks)]
    assert all(v.accepted for v in port.submit("v", outcomes).verdicts)
    task = port.poll("t", wait_s=0).train
    assert isinstance(task, TrainTask) and task.step == 1
    return task


@pytest.mark.parametrize("runner", ["threads", "grpc"])
def test_a_step_is_admitted_with_its_weights_only(hosted, runner):
    h = hosted(runner)
    port = h.port
    task = to_step_one(port)
    step, weights = trained(task)
    head = h.head()
    together = "a trainer submits a step's TrainStepCompleted and WeightsPublished of the same step together"
    assert together in refusal(lambda: port.submit("t", [step]))  # the lone step of the issue
    assert together in refusal(lambda: port.submit("t", [weights]))
    assert together in refusal(lambda: port.submit("t", [weights, step]))
    assert together in refusal(lambda: port.submit("t", [dataclasses.replace(step, step=2), weights]))
    assert "may not submit TrainStepCompleted" in refusal(lambda: port.submit("a", [step, weights]))
    # A pair whose weights do not follow version 0: neither half is written.
    forged = dataclasses.replace(weights, parent_digest="0" * 64)
    verdicts = port.submit("t", [step, forged]).verdicts
    assert [v.accepted for v in verdicts] == [False, False]
    assert "does not name version 0 and its digest as parent" in verdicts[1].reason
    assert verdicts[0].reason.startswith("not admitted without the rest of its submission: version 1 does not")
    assert h.head() == head and h.loop.state.trained == 0
    # The step goes back to the queue, and the trainer's real result is admitted whole.
    assert port.poll("t", wait_s=0).train.step == 1
    assert [v.accepted for v in port.submit("t", [step, weights]).verdicts] == [True, True]
    assert (h.loop.state.trained, h.loop.state.latest) == (1, 1)


def test_only_the_worker_the_step_was_handed_to_publishes_it(hosted):
    h = hosted("threads")
    port = h.port
    task = to_step_one(port)
    result = trained(task)
    port.leave("t", "replaced")  # its hand-out goes back; a new trainer takes the step
    port.join("t2", TRAINER)
    assert port.poll("t2", wait_s=0).train.step == 1
    verdicts = port.submit("t", result).verdicts  # the old trainer, still holding its secret
    assert [(v.accepted, v.reason) for v in verdicts] == [(False, "step 1 is not handed to 't' for training "
                                                                  "(it is handed to 't2')")] * 2
    assert h.loop.state.trained == 0
    assert [v.accepted for v in port.submit("t2", result).verdicts] == [True, True]


def test_a_step_not_handed_out_is_rejected_by_the_loop():
    h = hosting.Hosted("threads", OVERRIDES, bounded=True)
    task = to_step_one(h.port)
    result = trained(task)
    verdicts = h.loop.publish(result, worker_id="intruder")
    assert [v.accepted for v in verdicts] == [False, False]
    assert verdicts[0].reason == "step 1 is not handed to 'intruder' for training (it is handed to 't')"
    assert [v.accepted for v in h.loop.publish(result[:1], worker_id="t")] == [False]
    assert h.loop.state.trained == 0


# -- a run that makes no progress -------------------------------------------------------------------


def test_waiting_for_names_what_a_run_waits_for(hosted):
    h = hosted("threads")
    assert h.loop.waiting_for() == ("version 0 (WeightsPublished) from a trainer, handed to none; no inference or "
                                    "verifier or trainer worker is joined")
    task = to_step_one(h.port)
    assert h.loop.waiting_for() == ("train step 1 (TrainStepCompleted and WeightsPublished) from a trainer, "
                                    "handed to 't'")
    # A ledger written before steps were admitted with their weights: a lone step, as the issue's.
    step, _ = trained(task)
    assert [v.accepted for v in h.loop.submit([step])] == [True]
    assert h.loop.train_task("t") is None
    assert h.loop.waiting_for().startswith("WeightsPublished 1, which no trainer is asked for: step 1 was completed "
                                           "without its weights (latest version 0); the run cannot go on")


def host_of(config, store):
    from runtime.host.host import Host
    from runtime.host.retire import Retirer
    from runtime.params import ParamStore

    ctrl = ControllerLoop.create(store, run_id="r", config=config.to_dict(), config_digest=config.digest(), seed=1)
    pstore = ParamStore.open("memory://", create=True)
    lines: list[str] = []
    return Host(ctrl, pstore, config, Retirer(pstore), lines.append), lines


def watch_for(host, seconds: float) -> None:
    until = time.monotonic() + seconds
    host.watch(progress=False, stopped=lambda: time.monotonic() >= until, wait=lambda s: time.sleep(0.02))


def test_the_host_says_once_when_a_run_makes_no_progress():
    config = load_config(None, [*OVERRIDES, "workers.no_progress_s=0.5"], data_size=8)
    host, lines = host_of(config, open_store("memory://"))
    watch_for(host, 3.2)
    stalled = [line for line in lines if "no progress" in line]
    assert len(stalled) == 1, lines
    assert stalled[0].startswith("warning: run 'r' has made no progress for ")
    assert stalled[0].endswith("s (workers.no_progress_s): waiting for version 0 (WeightsPublished) from a "
                               "trainer, handed to none; no inference or verifier or trainer worker is joined")


def test_the_host_is_silent_while_the_run_moves_on_or_when_told_so():
    config = load_config(None, [*OVERRIDES, "workers.no_progress_s=0"], data_size=8)
    host, lines = host_of(config, open_store("memory://"))
    watch_for(host, 1.5)
    assert not [line for line in lines if "no progress" in line]
    config = load_config(None, [*OVERRIDES, "workers.no_progress_s=1.5"], data_size=8)
    host, lines = host_of(config, open_store("memory://"))
    ctrl = host.ctrl
    ctrl.join("t", TRAINER)
    ctrl.join("a", INFERENCE, slots=1)
    ctrl.join("v", VERIFIER)
    stop = threading.Event()

    def advance():  # one accepted input every 0.4 s: version 0, then each completion and outcome of batch 1
        assert isinstance(ctrl.train_task("t"), InitTask)
        ctrl.publish([SimTrainer("t", seed=1).initialize(InitTask())], worker_id="t")
        while not stop.wait(0.4):
            leases = ctrl.leases("a")
            if leases:
                assert [v.accepted for v in ctrl.complete(SimInference("a").generate(leases[:1]))] == [True]
                continue
            tasks = ctrl.scoring_work("v", 1)
            if tasks:
                assert [v.accepted for v in ctrl.record_outcomes(SimVerifier("v").score(tasks))] == [True]

    mover = threading.Thread(target=advance, daemon=True)
    mover.start()
    try:
        watch_for(host, 3.2)
    finally:
        stop.set()
        mover.join()
    assert not [line for line in lines if "no progress" in line], lines


def test_no_progress_s_is_checked():
    from runtime.config import ConfigError

    with pytest.raises(ConfigError, match="workers.no_progress_s: -1.0 is not accepted"):
        load_config(None, ["workers.no_progress_s=-1"], data_size=8)


# -- audit of a ledger poisoned before the checks -----------------------------------------------------


class SmallVocab(SimInference):
    """Simulated inference within the built-in model's vocabulary, except where told to poison."""

    def __init__(self, worker_id: str, poison: dict):
        super().__init__(worker_id, slots=4)
        self.poison = poison  # rollout id -> fields to replace

    def generate(self, leases):
        out = []
        for c in super().generate(leases):
            c = dataclasses.replace(c, tokens=(c.tokens % VOCAB).astype(np.int32))
            out.append(dataclasses.replace(c, **self.poison.get(c.rollout_id, {})))
        return out


def poisoned_run(directory: str) -> dict:
    """A run whose workers reached the loop without the front (as any token holder's submissions did
    before admission checked values): rollout 1 has an id outside the vocabulary, rollout 2 a NaN
    log-prob, rollout 3 a reward of 5 that did not pass. Returns {rollout id: seq of its poison}."""
    config = load_config(None, OVERRIDES, data_size=8)
    with open_store(f"{directory}/ledger.db", create=True) as store:
        loop = ControllerLoop.create(store, run_id="r", config=config.to_dict(), config_digest=config.digest(), seed=1)
        infer = SmallVocab("a", {1: {"tokens": np.array([3, 99], np.int32), "logprobs": np.array([-1, -1], np.float32)}})
        verifier, trainer = SimVerifier("v"), SimTrainer("t", seed=1)
        loop.join("a", INFERENCE, slots=4)
        loop.join("v", VERIFIER)
        loop.join("t", TRAINER)
        for _ in range(100):
            if loop.finished:
                break
            task = loop.train_task("t")
            if task is not None:
                result = [trainer.initialize(task)] if isinstance(task, InitTask) else list(trainer.train(task))
                loop.publish(result, worker_id="t")
            leases = loop.leases("a")
            if leases:
                done = infer.generate(leases)
                for i, c in enumerate(done):
                    if c.rollout_id == 2:
                        logprobs = np.array(c.logprobs, np.float32)
                        logprobs[0] = np.nan
                        done[i] = dataclasses.replace(c, logprobs=logprobs)
                loop.complete(done)
            tasks = loop.scoring_work("v", 1 << 20)
            if tasks:
                outcomes = verifier.score(tasks)
                outcomes = [dataclasses.replace(o, reward=5.0, passed=False, verdict="WA") if o.rollout_id == 3
                            else o for o in outcomes]
                loop.record_outcomes(outcomes)
        assert loop.finished
        seqs = {}
        for s in store.read("r"):
            e = s.event
            if type(e) is ev.RolloutCompleted and e.rollout_id in (1, 2):
                seqs[e.rollout_id] = s.seq
            if type(e) is ev.OutcomeRecorded and e.rollout_id == 3:
                seqs[3] = s.seq
    return seqs


def test_audit_check_names_a_poisoned_ledger(tmp_path, capsys):
    from runtime.cli import main

    out = str(tmp_path / "run")
    os.makedirs(out)
    seqs = poisoned_run(out)
    assert main(["audit", out, "check", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    values = [(v["seq"], v["kind"], v["message"]) for v in doc["violations"] if v["invariant"] == "I9"]
    assert values == [
        (seqs[1], "RolloutCompleted", f"rollout 1: token 1 is id 99; accepted: ids in [0, {VOCAB}) (the model's "
                                      "vocabulary)"),
        (seqs[2], "RolloutCompleted", "rollout 2: token 0 has log-prob nan; a log-prob is finite and <= 0"),
        (seqs[3], "OutcomeRecorded", "rollout 3: reward 5.0 is outside the tasks' range [0.0, 1.0]"),
    ]
    assert "I9" in doc["invariants"]


def test_audit_check_names_a_lone_step():
    """A step completed without its weights, as a token holder could append one before the fix."""
    h = hosting.Hosted("threads", OVERRIDES, bounded=True)
    task = to_step_one(h.port)
    step, _ = trained(task)
    assert [v.accepted for v in h.loop.submit([step])] == [True]
    stored = list(h.store.read("r"))
    seq = next(s.seq for s in stored if type(s.event) is ev.TrainStepCompleted)
    lone = [str(v) for v in check(stored, decisions=False) if v.invariant == "I8"]
    assert lone == [f"I8 at seq {seq}: step 1 completed without its WeightsPublished 1 beside it; no later step "
                    "can be handed out"]


def test_audit_check_passes_an_honest_simulated_run():
    from runtime.controller.simulation import run_to_end

    config = load_config(None, OVERRIDES, data_size=8)
    store = open_store("memory://")
    loop = ControllerLoop.create(store, run_id="r", config=config.to_dict(), config_digest=config.digest(), seed=1)
    run_to_end(loop, workers=1, slots=2)
    assert check(store.read("r")) == []
