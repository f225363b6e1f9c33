"""Beam pipelines over real SQLite ledgers (DirectRunner): rollout rows and version statistics,
checked against the audit's provenance index and against counts made by hand."""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest

from ledger import LedgerError, open_store
from ledger import events as ev
from ledger.pipelines import export_run
from runtime.audit import Provenance
from runtime.cli import main
from tests.runtime.controller.golden.regenerate import HERE, load


def _ledger(tmp_path, events, run_id="golden") -> str:
    path = str(tmp_path / "ledger.db")
    with open_store(path, create=True) as store:
        store.create_run(run_id)
        epoch = store.acquire_epoch(run_id)
        head = 0
        for i in range(0, len(events), 50):  # several transactions, as a run writes them
            head = store.append(run_id, events[i:i + 50], expected_seq=head, epoch=epoch).seq
    return path


def _rows(out: str, name: str) -> list[dict]:
    rows = []
    for path in sorted(glob.glob(os.path.join(out, f"{name}-*.jsonl"))):
        with open(path) as f:
            rows.extend(json.loads(line) for line in f)
    return rows


@pytest.fixture(scope="module")
def filtered(tmp_path_factory):
    """A controller history with uniform-reward groups discarded, its ledger and its export."""
    tmp = tmp_path_factory.mktemp("filtered")
    events = load(HERE / "deterministic_k0_filtered.msgpack")
    path = _ledger(tmp, events)
    counts = export_run(path, "golden", str(tmp / "out"), range_events=13)
    with open_store(path) as store:
        stored = list(store.read("golden"))
    return stored, counts, _rows(str(tmp / "out"), "rollouts"), _rows(str(tmp / "out"), "versions")


@pytest.mark.slow
def test_every_requested_rollout_has_one_row_agreeing_with_the_audit(filtered):
    stored, counts, rows, _ = filtered
    prov = Provenance.from_events(stored)
    assert counts["events"] == len(stored) and counts["rollouts"] == len(rows) == len(prov.requests)
    assert sorted(r["rollout_id"] for r in rows) == sorted(prov.requests)
    for row in rows:
        doc = prov.rollout(row["rollout_id"])
        for key in ("group_id", "batch", "prompt_index", "seed", "sampling", "policy_version", "staleness", "attempts",
                    "worker", "tokens", "finish_reason", "reward", "passed", "verdict", "verifier", "verifier_version",
                    "consumed_by_step", "discarded"):
            assert row[key] == doc[key], (row["rollout_id"], key)
        produced = doc["produced_version"]
        assert (row["produced_version"], row["produced_digest"]) == (
            (produced["version"], produced["digest"]) if produced else (None, None))
        assert row["run_id"] == "golden"
    assert any(r["discarded"] == "uniform_reward" for r in rows)  # the history has discarded groups
    assert any(r["consumed_by_step"] is not None for r in rows)


def test_tokens_and_logprobs_are_exported_bit_for_bit(filtered):
    stored, _, rows, _ = filtered
    completions = {s.event.rollout_id: s.event for s in stored if isinstance(s.event, ev.RolloutCompleted)}
    by_id = {r["rollout_id"]: r for r in rows}
    assert completions and set(completions) <= set(by_id)
    for rid, c in completions.items():
        row = by_id[rid]
        assert np.array(row["token_ids"], dtype=c.tokens.dtype).tobytes() == c.tokens.tobytes()
        assert np.array(row["logprobs"], dtype=c.logprobs.dtype).tobytes() == c.logprobs.tobytes()
        assert row["weights_digest"] == c.weights_digest


def test_version_rows_count_what_each_version_sampled(filtered):
    stored, counts, rows, versions = filtered
    want: dict[int, dict] = {}
    for r in rows:
        w = want.setdefault(r["policy_version"], {"rollouts": 0, "scored": 0, "passed": 0, "reward": 0.0, "consumed": 0})
        w["rollouts"] += 1
        w["consumed"] += r["consumed_by_step"] is not None
        if r["reward"] is not None:
            w["scored"] += 1
            w["passed"] += r["passed"]
            w["reward"] += r["reward"]
    published = {s.event.version: s.event.digest for s in stored if isinstance(s.event, ev.WeightsPublished)}
    assert counts["versions"] == len(versions) == len(want)
    for v in versions:
        w = want[v["version"]]
        assert (v["rollouts"], v["scored"], v["passed"], v["consumed"]) == (
            w["rollouts"], w["scored"], w["passed"], w["consumed"])
        assert v["pass_rate"] == pytest.approx(w["passed"] / w["scored"])
        assert v["mean_reward"] == pytest.approx(w["reward"] / w["scored"])
        assert v["digest"] == published[v["version"]]


@pytest.mark.slow
def test_step_rows_agree_with_the_audit(filtered, tmp_path):
    stored, counts, _, _ = filtered
    prov = Provenance.from_events(stored)
    out = str(tmp_path / "steps")
    export_run(_ledger(tmp_path, [s.event for s in stored]), "golden", out)
    steps = {r["step"]: r for r in _rows(out, "steps")}
    assert sorted(steps) == sorted(prov.batches) and counts["steps"] == len(steps)
    for n, row in steps.items():
        doc = prov.step(n)
        assert (row["batch_seq"], row["groups"], row["rollouts"], row["policy_versions"]) == (
            doc["batch_seq"], len(doc["group_ids"]), len(doc["rollout_ids"]), doc["policy_versions"])
        assert (row["staleness_max"], row["staleness_mean"], row["trained_seq"], row["metrics"]) == (
            doc["staleness_max"], doc["staleness_mean"], doc["trained_seq"], doc["metrics"])
        assert row["parent_digest"] == doc["parent"]["digest"]
        assert row["produced_digest"] == (doc["produced"]["digest"] if doc["produced"] else None)


@pytest.mark.slow
def test_read_ranges_do_not_change_the_rows(filtered, tmp_path):
    stored, _, rows, versions = filtered
    path = _ledger(tmp_path, [s.event for s in stored])
    export_run(path, "golden", str(tmp_path / "one"), range_events=10_000)
    key = lambda r: r["rollout_id"]  # noqa: E731
    assert sorted(_rows(str(tmp_path / "one"), "rollouts"), key=key) == sorted(rows, key=key)
    assert sorted(_rows(str(tmp_path / "one"), "versions"), key=lambda v: v["version"]) == sorted(
        versions, key=lambda v: v["version"])


@pytest.mark.slow
def test_leases_and_abandoned_attempts_are_counted(tmp_path):
    sampling = {"max_tokens": 4}
    events = [
        ev.RunStarted("r", {}, "c" * 64, 5),
        ev.WeightsPublished(0, "a" * 64, -1, ""),
        ev.RolloutRequested((0, 1), 0, 1, 17, 0, (99, 98), sampling),
        ev.RolloutAssigned("w1", (0, 1), (0, 0)),
        ev.RolloutAbandoned(0, 0, "lease expired"),
        ev.RolloutAssigned("w2", (0,), (1,)),
        ev.RolloutCompleted(0, "w2", 1, 0, "a" * 64, np.array([3, 4], np.int32), np.zeros(2, np.float32), "stop"),
        ev.OutcomeRecorded(0, 1.0, True, "AC", "math", "math/1"),
    ]
    export_run(_ledger(tmp_path, events, "r"), "r", str(tmp_path / "out"))
    rows = {r["rollout_id"]: r for r in _rows(str(tmp_path / "out"), "rollouts")}
    assert (rows[0]["attempts"], rows[0]["abandoned"], rows[0]["worker"], rows[0]["passed"]) == (
        2, ["lease expired"], "w2", True)
    assert (rows[1]["attempts"], rows[1]["tokens"], rows[1]["reward"], rows[1]["seed"]) == (1, None, None, 98)
    (v0,) = _rows(str(tmp_path / "out"), "versions")
    assert (v0["rollouts"], v0["completed"], v0["scored"], v0["pass_rate"], v0["mean_tokens"]) == (2, 1, 1, 1.0, 2.0)


@pytest.mark.slow
def test_bad_requests_write_nothing(filtered, tmp_path):
    stored, *_ = filtered
    path = _ledger(tmp_path, [s.event for s in stored])
    out = str(tmp_path / "out")
    with pytest.raises(LedgerError, match="memory://"):
        export_run("memory://", "golden", out)
    with pytest.raises(LedgerError, match="no run 'nope'"):
        export_run(path, "nope", out)
    with pytest.raises(LedgerError, match="--bogus_flag"):
        export_run(path, "golden", out, pipeline_args=["--bogus_flag=1"])
    with pytest.raises(LedgerError, match="Unexpected pipeline runner"):
        export_run(path, "golden", out, pipeline_args=["--runner=NoSuchRunner"])
    assert not os.path.exists(out)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(LedgerError, match="cannot create the output directory"):
        export_run(path, "golden", str(blocker / "out"))
    export_run(path, "golden", out)
    before = sorted(os.listdir(out))
    with pytest.raises(LedgerError, match="already holds an export"):
        export_run(path, "golden", out)
    assert sorted(os.listdir(out)) == before


def test_cli_export(filtered, tmp_path, capsys):
    stored, counts, rows, _ = filtered
    path = _ledger(tmp_path, [s.event for s in stored])
    out = str(tmp_path / "cli")
    assert main(["ledger", "export", path, "--out", out, "--json", "--", "--runner=DirectRunner"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc == {"run_id": "golden", "out": out, "events": len(stored), "rollouts": len(rows),
                   "versions": counts["versions"], "steps": counts["steps"]}
    from runtime.audit.text import RunText

    text = RunText(stored[0].event.config)  # the run's task and tokenizer, from its logged config
    exported = _rows(out, "rollouts")
    assert {r["rollout_id"] for r in exported} == {r["rollout_id"] for r in rows}
    for r in exported:
        assert r["prompt"] == text.prompt(r["prompt_index"]) and "+" in r["prompt"]
        assert r["completion"] == (None if r["token_ids"] is None else text.completion(r["token_ids"]))
    assert any(r["completion"] for r in exported)
    assert main(["ledger", "export", path, "--out", out]) == 2
    assert "already holds an export" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:  # only export takes options after --
        main(["ledger", "verify", path, "--", "--runner=DirectRunner"])
    assert info.value.code == 2 and "unexpected arguments after --" in capsys.readouterr().err


@pytest.mark.slow
def test_export_from_postgresql_matches_sqlite(filtered, pg_url, tmp_path):
    stored, _, rows, versions = filtered
    with open_store(pg_url, create=True) as store:
        store.create_run("golden")
        epoch = store.acquire_epoch("golden")
        store.append("golden", [s.event for s in stored], expected_seq=0, epoch=epoch)
    counts = export_run(pg_url, "golden", str(tmp_path / "pg"), range_events=40)
    assert counts["events"] == len(stored)
    key = lambda r: r["rollout_id"]  # noqa: E731
    assert sorted(_rows(str(tmp_path / "pg"), "rollouts"), key=key) == sorted(rows, key=key)
    assert len(_rows(str(tmp_path / "pg"), "versions")) == len(versions)
