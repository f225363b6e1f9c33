"""Held-out evaluation during a run: the pass@k estimator, the fold's admission of
``VersionEvaluated``, and a small real run that evaluates every second version, twice, with its
TensorBoard scalars read back from the event files."""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import struct

import pytest

from ledger import events as ev
from ledger import open_store
from runtime.config import Config, ConfigError
from runtime.controller.admit import admit
from runtime.controller.reduce import fold
from runtime.evaluation import pass_at_k, sample_seeds
from tests.runtime.small_run import STEPS, tiny_config, write_sums

# -- the estimator ------------------------------------------------------------------------------


def test_pass_at_k_matches_the_binomial_formula():
    # n=10 samples, c=3 passed, k=2: 1 - C(7, 2) / C(10, 2) = 1 - 21/45 = 0.5333…
    assert pass_at_k(10, 3, 2) == pytest.approx(24 / 45, abs=1e-12)
    assert pass_at_k(8, 1, 1) == pytest.approx(1 / 8, abs=1e-12)  # pass@1 is the pass fraction
    assert pass_at_k(8, 0, 8) == 0.0 and pass_at_k(8, 1, 8) == 1.0  # k = n: any pass counts
    assert pass_at_k(5, 4, 2) == 1.0  # fewer than k failures: every k-subset holds a pass
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1.0 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12), (n, c, k)
    for bad in ((4, 5, 1), (4, 1, 5), (4, 1, 0), (4, -1, 1)):
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_sample_seeds_are_a_function_of_seed_version_problem_and_sample():
    a = sample_seeds(1, 2, 3, 4)
    assert len(a) == 12 and len(set(a)) == 12 and a == sample_seeds(1, 2, 3, 4)
    assert a[:4] == sample_seeds(1, 2, 1, 4)  # problem-major: a smaller evaluation is a prefix
    assert set(a).isdisjoint(sample_seeds(1, 3, 3, 4)) and set(a).isdisjoint(sample_seeds(2, 2, 3, 4))


# -- config -------------------------------------------------------------------------------------


def test_eval_config_resolves_k_and_samples_and_refuses_bad_values():
    c = Config.from_dict({"sampling": {"group_size": 6}}).resolved()
    assert (c.eval.every_steps, c.eval.k, c.eval.samples) == (100, 6, 6)
    c = Config.from_dict({"eval": {"k": 2, "samples": 5}}).resolved()
    assert (c.eval.k, c.eval.samples) == (2, 5)
    for table, words in (({"every_steps": -1}, "eval.every_steps"), ({"size": 0}, "eval.size"),
                         ({"k": 4, "samples": 2}, "eval.samples: 2 is not accepted; it must be >= eval.k (4)"),
                         ({"samples": 5000}, "it must be <= 1024")):
        with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
            Config.from_dict({"eval": table})
    with pytest.raises(ConfigError, match="eval.samples: 3 is not accepted"):  # k defaults to group_size 8
        Config.from_dict({"eval": {"samples": 3}}).resolved()
    with pytest.raises(ConfigError, match="log.tensorboard"):
        Config.from_dict({"log": {"tensorboard": " "}})


# -- admission ------------------------------------------------------------------------------------


def _started(every: int, steps: int = 5) -> list[ev.Event]:
    config = Config.from_dict({"run": {"steps": steps}, "eval": {"every_steps": every}}).resolved(data_size=100)
    return [ev.RunStarted("r", config.to_dict(), config.digest(), 0), ev.WeightsPublished(0, "d0", -1, "")]


def _evaluation(version: int, digest: str, **changes) -> ev.VersionEvaluated:
    e = ev.VersionEvaluated(version, digest, 10, 0.5, 2, 4, 0.75, 0.5, "evaluator")
    return dataclasses.replace(e, **changes)


def test_one_evaluation_per_due_version_naming_its_published_digest():
    state = fold(_started(every=2))
    assert state.due_evaluations == ((0, "d0"),)
    assert admit(state, _evaluation(0, "other")) == \
        "version 0: weights digest other… is not the one published (d0…)"
    assert "is not published" in admit(state, _evaluation(1, "d1"))
    assert "rate in [0, 1]" in admit(state, _evaluation(0, "d0", pass_at_k=1.5))
    assert "rate in [0, 1]" in admit(state, _evaluation(0, "d0", greedy_pass_rate=float("nan")))
    assert "1 <= k <= samples" in admit(state, _evaluation(0, "d0", k=5))
    good = _evaluation(0, "d0")
    assert admit(state, good) is None
    after = fold([good], state)
    assert after.due_evaluations == ()
    assert "no evaluation due (evaluated already" in admit(after, good)  # a duplicate


def test_due_versions_follow_every_steps_and_the_final_version():
    from runtime.controller.spec import ControllerSpec

    config = Config.from_dict({"run": {"steps": 5}, "eval": {"every_steps": 2}}).resolved(data_size=100)
    spec = ControllerSpec.from_config(config.to_dict(), 0)
    assert [v for v in range(7) if spec.evaluated(v)] == [0, 2, 4, 5]
    off = dataclasses.replace(config, eval=dataclasses.replace(config.eval, every_steps=0))
    assert not any(ControllerSpec.from_config(off.to_dict(), 0).evaluated(v) for v in range(7))
    old = {k: v for k, v in config.to_dict().items() if k != "eval"}  # a run recorded before evaluation
    assert ControllerSpec.from_config(old, 0).eval_every == 0


# -- a real run ---------------------------------------------------------------------------------------


def _records(path: str):
    """The records of a TensorBoard event file (TFRecord framing: length, its CRC, data, its CRC)."""
    from tensorboardX.crc32c import crc32c

    def masked(data: bytes) -> int:
        crc = crc32c(data)
        return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    with open(path, "rb") as f:
        raw = f.read()
    at = 0
    while at < len(raw):
        header = raw[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", raw[at + 8:at + 12])[0] == masked(header)
        data = raw[at + 12:at + 12 + length]
        assert struct.unpack("<I", raw[at + 12 + length:at + 16 + length])[0] == masked(data)
        yield data
        at += 16 + length


def _scalars(logdir: str) -> dict[str, dict[int, float]]:
    """Every scalar in the event files of ``logdir``: tag -> step -> value."""
    from tensorboardX.proto.event_pb2 import Event

    out: dict[str, dict[int, float]] = {}
    files = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
    assert files
    for path in files:
        for data in _records(path):
            e = Event.FromString(data)
            for v in e.summary.value:
                out.setdefault(v.tag, {})[e.step] = v.simple_value
    return out


@pytest.fixture(scope="module")
def evaluated_runs(tmp_path_factory):
    """Two identical small runs (threads mode) that evaluate every second version; the first
    also writes TensorBoard logs."""
    from runtime.run import run

    root = tmp_path_factory.mktemp("evaluated")
    write_sums(root / "sums.jsonl")
    base = tiny_config(str(root / "sums.jsonl"), str(tmp_path_factory.getbasetemp() / "warm_start"))
    outs = []
    for i in range(2):
        config = dataclasses.replace(
            base, eval=dataclasses.replace(base.eval, every_steps=2, size=5, k=2, samples=3),
            log=dataclasses.replace(base.log, tensorboard=str(root / "tb") if i == 0 else None))
        out = str(root / f"run{i}")
        summary = run(config, out, progress=False, log=lambda m: None)
        outs.append((out, summary))
    return outs, str(root / "tb"), config


def _stored(out: str):
    with open_store(out) as store:
        return list(store.read("run"))


@pytest.mark.slow
def test_a_run_evaluates_due_versions_deterministically(evaluated_runs):
    (out, summary), (out2, summary2) = evaluated_runs[0]
    stored = _stored(out)
    published = {s.event.version: s.event.digest for s in stored if type(s.event) is ev.WeightsPublished}
    evals = [s.event for s in stored if type(s.event) is ev.VersionEvaluated]
    assert [e.version for e in sorted(evals, key=lambda e: e.version)] == [0, 2, STEPS]  # every 2nd, and the final
    for e in evals:
        assert e.digest == published[e.version]
        assert (e.problems, e.k, e.samples) == (5, 2, 3)  # the held-out split has 5 of the 25 sums
        assert all(0.0 <= rate <= 1.0 for rate in (e.greedy_pass_rate, e.pass_at_k, e.sampled_pass_rate))
        assert round(e.greedy_pass_rate * 5, 9) % 1 == 0 and round(e.sampled_pass_rate * 15, 9) % 1 == 0  # counts
        assert e.pass_at_k >= e.sampled_pass_rate - 1e-12  # pass@2 never below pass@1
    other = sorted((s.event for s in _stored(out2) if type(s.event) is ev.VersionEvaluated), key=lambda e: e.version)
    assert sorted(evals, key=lambda e: e.version) == other  # the same values, bit for bit
    assert summary["final_digest"] == summary2["final_digest"]
    assert [m["greedy_pass_rate"] for m in summary["evaluations"]] == [e.greedy_pass_rate for e in other]
    assert [m["version"] for m in summary["evaluations"]] == [0, 2, STEPS]
    assert all(m["wall_seconds"] >= 0 for m in summary["evaluations"])
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        assert json.load(f)["evaluations"] == summary["evaluations"]
    assert os.path.getsize(os.path.join(out, "report.png")) > 0


@pytest.mark.slow
def test_an_evaluated_run_audits_clean_replays_bit_exactly_and_shows_its_evaluations(evaluated_runs, capsys):
    from runtime.cli import main
    from runtime.replay import replay_run

    out, summary = evaluated_runs[0][0]
    assert main(["audit", out, "check", "--json"]) == 0
    capsys.readouterr()
    report = replay_run(out, warn=lambda m: None)
    assert report.match, report.first_divergence
    assert report.final_digest == summary["final_digest"]
    assert main(["audit", out, "version", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["version"]["evaluation"]
    want = next(m for m in summary["evaluations"] if m["version"] == 2)
    assert (doc["greedy_pass_rate"], doc["pass_at_k"], doc["k"], doc["samples"], doc["problems"]) == \
        (want["greedy_pass_rate"], want["pass_at_k"], 2, 3, 5)
    assert main(["audit", out, "version", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["version"]["evaluation"] is None
    assert main(["audit", out, "version", "2"]) == 0
    assert f"pass@2 {want['pass_at_k']:.1%}" in capsys.readouterr().out


@pytest.mark.slow
def test_an_evaluation_naming_other_weights_is_an_audit_violation(evaluated_runs, tmp_path):
    from runtime.controller import invariants

    out = evaluated_runs[0][0][0]
    stored = _stored(out)
    edited = [dataclasses.replace(s.event, digest="0" * 64) if type(s.event) is ev.VersionEvaluated else s.event
              for s in stored]
    found = invariants.check(edited, decisions=True)
    assert {v.invariant for v in found} >= {"I8", "I6"}
    assert any("names weights 0000000000000000" in v.message for v in found)
    twice = [s.event for s in stored] + [next(s.event for s in stored if type(s.event) is ev.VersionEvaluated)]
    assert any("second evaluation of version" in v.message for v in invariants.check(twice, decisions=False))


@pytest.mark.slow
def test_tensorboard_logs_hold_train_rollout_throughput_and_eval_scalars(evaluated_runs):
    (out, summary), _ = evaluated_runs[0]
    scalars = _scalars(evaluated_runs[1])
    steps = {m["step"]: m for m in summary["metrics"]}
    assert set(scalars["train/loss"]) == set(steps) == set(range(1, STEPS + 1))
    for s, m in steps.items():
        assert scalars["train/loss"][s] == pytest.approx(m["loss"], rel=1e-6)  # float32 in the file
        assert scalars["train/reward_mean"][s] == pytest.approx(m["reward_mean"], rel=1e-6)
    assert set(scalars["rollout/pass_rate"]) <= set(steps) and scalars["rollout/pass_rate"]
    assert all(0.0 <= v <= 1.0 for v in scalars["rollout/pass_rate"].values())
    assert all(v > 0 for v in scalars["throughput/steps_per_min"].values())
    for m in summary["evaluations"]:
        assert scalars["eval/greedy_pass_rate"][m["version"]] == pytest.approx(m["greedy_pass_rate"], rel=1e-6)
        assert scalars["eval/pass_at_k"][m["version"]] == pytest.approx(m["pass_at_k"], rel=1e-6)


@pytest.mark.slow
def test_processes_mode_records_the_same_evaluations(evaluated_runs, tmp_path):
    """The evaluator of a processes-mode run (this process's idle engine) records what the
    threads-mode runs recorded (an engine of its own): the same events, bit for bit."""
    from runtime.run import run

    (out, summary), _ = evaluated_runs[0]
    config = evaluated_runs[2]
    config = dataclasses.replace(config, workers=dataclasses.replace(config.workers, mode="processes"))
    other = run(config, str(tmp_path / "run"), progress=False, log=lambda m: None)
    assert other["final_digest"] == summary["final_digest"]
    mine = sorted((s.event for s in _stored(str(tmp_path / "run")) if type(s.event) is ev.VersionEvaluated),
                  key=lambda e: e.version)
    assert mine == sorted((s.event for s in _stored(out) if type(s.event) is ev.VersionEvaluated),
                          key=lambda e: e.version)
    assert [e.version for e in mine] == [0, 2, STEPS]


def test_tensorboard_log_writes_each_kind_of_scalar_at_its_step(tmp_path):
    from runtime.metrics_log import RATE_WINDOW, TensorBoardLog

    times = iter(float(t) for t in range(0, 1000, 6))  # one commit every 6 s
    log = TensorBoardLog(str(tmp_path), clock=lambda: next(times))
    log.observe([ev.OutcomeRecorded(0, 1.0, True, "AC", "math", "1"), ev.OutcomeRecorded(1, 0.0, False, "WA", "math", "1"),
                 ev.WorkerLost("w", "gone")])  # t=0
    for step in range(1, 13):  # t=6, 12, …, 72
        log.observe([ev.TrainStepCompleted(step, "b", {"loss": 0.5 * step, "count": 3})])
    log.observe([_evaluation(10, "d10")])
    log.close()
    log.observe([_evaluation(12, "d12")])  # after close: dropped, no error
    scalars = _scalars(str(tmp_path))
    assert scalars["train/loss"] == {s: pytest.approx(0.5 * s) for s in range(1, 13)}
    assert scalars["rollout/reward_mean"] == {1: 0.5} and scalars["rollout/pass_rate"] == {1: 0.5}
    # 10 steps per 60 s once the window is full; at step 1, one step in the 6 s since the log started.
    assert scalars["throughput/steps_per_min"][1] == pytest.approx(10.0)
    assert scalars["throughput/steps_per_min"][12] == pytest.approx(60.0 * RATE_WINDOW / (6 * RATE_WINDOW))
    assert scalars["eval/pass_at_k"] == {10: 0.75} and scalars["eval/greedy_pass_rate"] == {10: 0.5}
