"""``rlx replay`` on a small real run: bit-exact replay and re-sampling, and every way it must fail.

The run (3 steps, max_staleness 1, keep_newest 1 — resolved to 2, max_staleness + 1, so the
trainer always has the weights its rollouts were sampled from) is built once for the module. Its
data are two-digit sums a tiny model learns in its warm start well enough that groups get mixed
rewards, so every step really moves the weights.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3

import numpy as np
import pytest

from ledger import events as ev
from ledger import open_store
from runtime.cli import main
from runtime.errors import UsageError
from runtime.params import ParamStore
from runtime.replay import compare_rollout, fingerprint_diff, plan_replay, replay_run, replay_start
from runtime.replay.plan import SampledRollout
from runtime.replay.runner import recorded_engine_shapes
from tests.runtime.small_run import STEPS


@pytest.fixture(scope="module")
def finished(small_run):
    """(run directory, summary) of the shared small run."""
    out, summary, _ = small_run
    return out, summary


def events_of(directory: str) -> list:
    with open_store(directory) as store:
        return list(store.read("run"))


def copy_run(src: str, dst, edit) -> str:
    """A copy of the run directory whose ledger holds ``edit(event)`` of every event (a new chain)."""
    dst = str(dst)
    shutil.copytree(f"{src}/params", f"{dst}/params")
    with open_store(f"{dst}/ledger.db", create=True) as store:
        store.create_run("run")
        epoch = store.acquire_epoch("run")
        store.append("run", [edit(s.event) for s in events_of(src)], expected_seq=0, epoch=epoch)
    return dst


def seq_of(events, kind, **fields) -> int:
    return next(s.seq for s in events if isinstance(s.event, kind)
                and all(getattr(s.event, k) == v for k, v in fields.items()))


@pytest.mark.slow
def test_a_finished_run_replays_bit_exactly_with_every_rollout_resampled(finished):
    out, summary = finished
    warnings: list[str] = []
    report = replay_run(out, regenerate=True, warn=warnings.append)
    assert report.match, report.first_divergence
    assert warnings == []  # same stack, and the rebuilt engine has the batch shape the run recorded
    shapes = recorded_engine_shapes(events_of(out))
    assert len(shapes) == 1 and shapes[0]["max_slots"] == 8 and shapes[0]["prefill_buckets"] == [5]  # "<bos>a+b="
    assert report.versions_verified == STEPS + 1  # version 0 and one per step
    assert (report.final_version, report.final_digest) == (STEPS, summary["final_digest"])
    assert report.rollouts_regenerated == summary["rollouts"] == STEPS * 2 * 4
    assert report.fingerprint_diff == {}
    assert report.to_dict()["first_divergence"] is None


@pytest.mark.slow
def test_the_plan_rebuilds_each_train_task_and_hides_retired_versions(finished):
    out, _ = finished
    events = events_of(out)
    plan = plan_replay(events)
    assert [s.step for s in plan.steps] == [1, 2, 3]
    assert len({p.event.digest for p in plan.versions.values()}) == 4  # every step moved the weights
    batches = {s.event.step: s.event for s in events if isinstance(s.event, ev.BatchFormed)}
    for step in plan.steps:
        assert step.task.batch == batches[step.step]
        assert [r.request.rollout_id for r in step.task.rollouts] == list(batches[step.step].rollout_ids)
        assert step.task.parent_digest == plan.versions[step.step - 1].event.digest
    # Batches 1 and 2 come from version 0, batch 3 from version 1 (max_staleness 1); every step
    # finds the versions its rollouts came from (keep_newest >= max_staleness + 1).
    assert [sorted(s.row_versions()) for s in plan.steps] == [[0], [0], [1]]
    assert [s.unavailable for s in plan.steps] == [frozenset(), frozenset(), frozenset()]
    assert plan.retained == (0, 1, 2, 3)
    assert {v: len(rs) for v, rs in plan.rollouts.items()} == {0: 16, 1: 8}


@pytest.mark.slow
def test_replay_from_a_stored_version(finished):
    out, summary = finished
    report = replay_run(out, from_version=2)
    assert report.match and report.versions_verified == 1
    assert report.final_digest == summary["final_digest"]
    earlier = replay_run(out, from_version=1)
    assert earlier.match and earlier.versions_verified == 2 and earlier.final_digest == summary["final_digest"]
    with pytest.raises(UsageError, match=r"--from-version 7 is not accepted; run 'run' has versions 0\.\.3"):
        replay_run(out, from_version=7)


@pytest.mark.slow
def test_a_flipped_byte_in_an_event_body_is_named_by_verify_and_replay(finished, tmp_path, capsys):
    out, _ = finished
    bad = str(tmp_path / "bad")
    shutil.copytree(out, bad)
    target = seq_of(events_of(out), ev.WeightsPublished, version=1)
    with sqlite3.connect(f"{bad}/ledger.db") as db:
        (body,) = db.execute("SELECT body FROM rlx_events WHERE seq = ?", (target,)).fetchone()
        flipped = bytearray(body)
        flipped[len(flipped) // 2] ^= 0x01
        db.execute("UPDATE rlx_events SET body = ? WHERE seq = ?", (bytes(flipped), target))
    report = replay_run(bad)
    assert not report.match and report.versions_verified == 0
    first = report.first_divergence
    assert (first.stage, first.seq, first.kind, first.field) == ("ledger", target, "WeightsPublished", "chain")
    assert main(["ledger", "verify", bad]) == 1
    assert f"CORRUPT at seq {target}" in capsys.readouterr().out
    assert main(["replay", bad, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["first_divergence"]["seq"] == target
    assert main(["audit", bad, "check", "--json"]) == 1
    chain = json.loads(capsys.readouterr().out)["chain"]
    assert (chain["ok"], chain["first_bad_seq"]) == (False, target)


@pytest.mark.slow
def test_a_deleted_parameter_version_is_reported(finished, tmp_path):
    out, _ = finished
    bad = str(tmp_path / "bad")
    shutil.copytree(out, bad)
    ParamStore.open(f"{bad}/params").delete(3)
    report = replay_run(bad, from_version=2)
    assert not report.match
    assert report.versions_verified == 1  # the weights themselves still replay
    (d,) = report.divergences
    assert (d.stage, d.version, d.field) == ("params", 3, "stored")
    assert d.seq == seq_of(events_of(out), ev.WeightsPublished, version=3)
    assert "version 3 is retained by the run but missing from the parameter store" in d.message


@pytest.mark.slow
def test_a_divergent_step_is_named_by_seq_version_and_field_and_a_new_stack_warns(finished, tmp_path, capsys):
    out, _ = finished

    def edit(e):  # the trainer's stack is the one a replay re-trains on
        if isinstance(e, ev.WorkerJoined) and e.role == "trainer":
            return dataclasses.replace(e, info={**e.info, "fingerprint": {**e.info["fingerprint"], "cores": 999}})
        if isinstance(e, ev.TrainStepCompleted) and e.step == 3:
            return dataclasses.replace(e, metrics={**e.metrics, "loss": e.metrics["loss"] + 1e-7})
        return e

    edited = copy_run(out, tmp_path / "edited", edit)
    assert main(["replay", edited, "--from-version", "2", "--json"]) == 1
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    warnings = [line for line in captured.err.splitlines() if line.startswith("rlx: warning:")]
    assert len(warnings) == 1 and "cores" in warnings[0] and warnings[0].startswith("rlx: warning:")
    assert doc["match"] is False and doc["fingerprint_differs"] is True
    assert doc["fingerprint_diff"]["cores"]["recorded"] == 999
    assert doc["versions_verified"] == 1  # the weights digest still matches
    first = doc["first_divergence"]
    assert first["seq"] == seq_of(events_of(out), ev.TrainStepCompleted, step=3)
    assert (first["stage"], first["kind"], first["version"], first["field"]) == (
        "weights", "TrainStepCompleted", 3, "metrics.loss")


def _sampled(tokens, logprobs, finish="stop") -> SampledRollout:
    from runtime.controller import Lease

    lease = Lease(7, 0, 1, 1, 0, 3, 0, "d" * 64, 11, {"max_tokens": 4})
    return SampledRollout(40, lease, ev.RolloutCompleted(7, "w", 0, 0, "d" * 64, np.asarray(tokens, np.int32),
                                                          np.asarray(logprobs, np.float32), finish))


def test_rollout_comparison_is_by_token_and_log_prob_bit():
    logged = _sampled([5, 6, 2], [-0.5, -1.25, 0.0])
    same = _sampled([5, 6, 2], [-0.5, -1.25, 0.0]).completion
    assert compare_rollout(logged, same) is None
    d = compare_rollout(logged, _sampled([5, 7, 2], [-0.5, -1.25, 0.0]).completion)
    assert (d.stage, d.seq, d.rollout_id, d.field) == ("rollout", 40, 7, "tokens")
    assert d.message == "token 1 differs: logged 6, regenerated 7"
    # -0.0 equals 0.0 as a number but not as bits.
    d = compare_rollout(logged, _sampled([5, 6, 2], [-0.5, -1.25, -0.0]).completion)
    assert d.field == "logprobs" and d.message == "log-prob bits 2 differs: logged 0x00000000, regenerated 0x80000000"
    d = compare_rollout(logged, _sampled([5, 6], [-0.5, -1.25]).completion)
    assert d.field == "tokens" and d.message == "logged 3 values, regenerated 2"
    d = compare_rollout(logged, _sampled([5, 6, 2], [-0.5, -1.25, 0.0], "length").completion)
    assert d.field == "finish_reason"


def test_fingerprint_diff_lists_differing_keys_only():
    assert fingerprint_diff({"jax": "0.10.2", "cores": 2}, {"jax": "0.10.2", "cores": 1, "cpu": "x"}) == {
        "cores": {"recorded": 2, "current": 1},
        "cpu": {"recorded": None, "current": "x"},
    }


@pytest.fixture(scope="module")
def checkpointed(small_run, tmp_path_factory):
    """A 5-step run of the small run's config with max_staleness 0, ``params.keep_every`` 2 and a
    controller snapshot every 25 events."""
    from runtime.run import run

    _, _, config = small_run
    config = dataclasses.replace(
        config, run=dataclasses.replace(config.run, steps=5),
        scheduling=dataclasses.replace(config.scheduling, max_staleness=0),
        params=dataclasses.replace(config.params, keep_every=2),
        ledger=dataclasses.replace(config.ledger, snapshot_every=25))
    out = str(tmp_path_factory.mktemp("checkpointed") / "run")
    summary = run(config, out, progress=False, log=lambda m: None)
    return out, summary


@pytest.mark.slow
def test_keep_every_keeps_checkpoints_a_replay_starts_from(checkpointed, capsys):
    out, summary = checkpointed
    # Versions 2 and 4 are checkpoints; 1 and 3 are retired; 0 is the root and 5 the newest.
    assert ParamStore.open(f"{out}/params").versions() == (0, 2, 4, 5)
    plan = plan_replay(events_of(out))
    assert plan.retained == (0, 2, 4, 5)
    assert [replay_start(plan, v) for v in range(6)] == [0, 0, 2, 2, 4, 5]
    assert main(["audit", out, "check", "--json"]) == 0
    capsys.readouterr()
    assert main(["replay", out, "--from-version", "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["from_version"], doc["requested_version"]) == (2, 3)
    assert doc["match"] and doc["versions_verified"] == 3  # versions 3, 4 and 5, re-derived from 2
    assert (doc["final_version"], doc["final_digest"]) == (5, summary["final_digest"])


@pytest.mark.slow
def test_a_checkpoint_whose_weights_differ_from_the_ledger_is_refused(checkpointed, tmp_path):
    out, _ = checkpointed
    bad = str(tmp_path / "bad")
    shutil.copytree(out, bad)
    store = ParamStore.open(f"{bad}/params")
    params, opt = store.get(4), store.get_opt_state(4)
    store.delete(2)
    store.put(2, params, opt)  # version 4's weights under version 2
    with pytest.raises(UsageError, match="stored version 2 does not have the digest the ledger names"):
        replay_run(bad, from_version=3)


@pytest.mark.slow
def test_check_snapshots_proves_each_snapshot_and_names_one_that_is_not_the_fold(checkpointed, tmp_path, capsys):
    from ledger.store import StoredSnapshot
    from runtime.controller import snapshot

    out, summary = checkpointed
    with open_store(out) as store:
        snaps = store.snapshots("run")
    assert len(snaps) == snapshot.KEPT
    assert main(["replay", out, "--check-snapshots", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["match"] and doc["snapshots_checked"] == snapshot.KEPT
    assert doc["final_digest"] == summary["final_digest"]
    # A forged snapshot: an older state under the newest one's seq, with a checksum that holds.
    bad = str(tmp_path / "forged")
    shutil.copytree(out, bad)
    newest, older = snaps[0], snaps[1]
    forged = StoredSnapshot(newest.run_id, newest.seq, newest.format, newest.chain_digest, older.body,
                            snapshot.checksum(newest.chain_digest, older.body))
    with open_store(bad) as store:
        store.put_snapshot(forged, keep=snapshot.KEPT)
    report = replay_run(bad, check_snapshots=True)
    assert not report.match and report.snapshots_checked == snapshot.KEPT - 1
    first = report.first_divergence
    assert (first.stage, first.seq, first.field) == ("snapshot", newest.seq, "state")
    assert "differs from the fold" in first.message
    assert report.final_digest == summary["final_digest"]  # the weights still replay: only the snapshot is wrong
    assert replay_run(bad).match  # without the flag snapshots are not read


@pytest.mark.slow
def test_the_replay_samples_with_the_engine_shape_the_run_recorded(finished, monkeypatch):
    """A run recorded under another engine rule (here: the prefill bucket a power of two, as
    before it was the longest prompt) re-samples with the shape its workers recorded."""
    from runtime.session import EngineShape

    out, summary = finished
    original = EngineShape.for_run

    def power_of_two_bucket(config, width):
        return dataclasses.replace(original(config, width), buckets=(16,))

    monkeypatch.setattr(EngineShape, "for_run", power_of_two_bucket)
    warnings: list[str] = []
    report = replay_run(out, regenerate=True, warn=warnings.append)
    assert report.match, report.first_divergence
    assert warnings == []
    assert report.rollouts_regenerated == summary["rollouts"]


@pytest.mark.slow
def test_a_replay_holds_only_the_versions_it_still_needs(tmp_path_factory):
    """Six steps at max_staleness 1: each step trains from the newest version on rows of the one
    before it, so besides version 0 the replay needs at most three versions at once, not all
    seven it re-derives (each held with its optimizer state)."""
    import dataclasses

    from runtime.run import run
    from tests.runtime.small_run import tiny_config, write_sums

    root = tmp_path_factory.mktemp("six_steps")
    write_sums(root / "sums.jsonl")
    config = tiny_config(str(root / "sums.jsonl"), str(tmp_path_factory.getbasetemp() / "warm_start"))
    config = dataclasses.replace(config, run=dataclasses.replace(config.run, steps=6))
    out = str(root / "run")
    summary = run(config, out, progress=False, log=lambda m: None)
    for regenerate in (False, True):
        report = replay_run(out, regenerate=regenerate)
        assert report.match, report.first_divergence
        assert (report.versions_verified, report.final_digest) == (7, summary["final_digest"])
        assert report.versions_held_max == 4, (regenerate, report.versions_held_max)
        assert report.to_dict()["versions_held_max"] == 4
