"""A query's index (``runtime.audit.index``) against the full fold, and the summarised tables.

The run: a simulated controller run on a SQLite ledger with lost leases (one inference worker
leaves every other lease to expire, so rollouts are abandoned and leased again), groups
discarded for uniform rewards, and 16 rollouts per batch over 14 steps, so the parent chain and
the batch are longer than the table shows by default.
"""

from __future__ import annotations

import json

import pytest

from ledger import events as ev
from ledger import open_store
from ledger.errors import CorruptLedger
from runtime.audit import Provenance
from runtime.audit.index import SPINE, query_events
from runtime.cli import main
from runtime.commands.audit import SHOWN
from runtime.config import load_config
from runtime.controller.loop import ControllerLoop
from runtime.controller.simulation import SimInference, SimTrainer, SimVerifier, train_once
from runtime.controller.workers import INFERENCE, TRAINER, VERIFIER
from runtime.errors import UsageError

STEPS = 14


def _faulty_run(path: str) -> None:
    now = [0.0]
    config = load_config(None, [f"run.steps={STEPS}", "run.seed=3", "sampling.group_size=4",
                                "scheduling.groups_per_batch=4", "scheduling.max_staleness=1",
                                "scheduling.filter_groups=true"], data_size=64)
    store = open_store(path, create=True)
    loop = ControllerLoop.create(store, run_id="run", config=config.to_dict(), config_digest=config.digest(),
                                 seed=3, clock=lambda: now[0], lease_timeout_s=5.0)
    good, flaky = SimInference("inference-0", 4), SimInference("inference-1", 4)
    verifier, trainer = SimVerifier(), SimTrainer(seed=3)
    for w in (good, flaky):
        loop.join(w.worker_id, INFERENCE, slots=w.slots)
    loop.join(verifier.worker_id, VERIFIER)
    loop.join(trainer.worker_id, TRAINER)
    for _ in range(5000):
        if loop.finished:
            break
        now[0] += 1.0
        for worker_id in (good.worker_id, flaky.worker_id, verifier.worker_id, trainer.worker_id):
            loop.heartbeat(worker_id)
        train_once(loop, trainer)
        if leases := loop.leases(good.worker_id):
            loop.complete(good.generate(leases))
        # The flaky worker finishes only the leases whose id and attempt add up to an even number.
        if leases := [q for q in loop.leases(flaky.worker_id) if (q.rollout_id + q.attempt) % 2 == 0]:
            loop.complete(flaky.generate(leases))
        if tasks := loop.scoring_work(verifier.worker_id, 1 << 30):
            loop.record_outcomes(verifier.score(tasks))
        loop.expire()
    assert loop.finished
    store.close()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("faulty")
    _faulty_run(str(out / "ledger.db"))
    return str(out)


@pytest.fixture(scope="module")
def stored(run_dir):
    with open_store(run_dir, readonly=True) as store:
        return list(store.read("run"))


def test_the_run_has_what_the_index_must_get_right(stored):
    kinds = {s.kind for s in stored}
    assert {"RolloutAbandoned", "GroupDiscarded", "VersionsRetired"} <= kinds
    assert max(len(s.event.rollout_ids) for s in stored if type(s.event) is ev.BatchFormed) > SHOWN


def test_every_answer_of_the_index_is_the_full_folds(run_dir, stored):
    full = Provenance.from_events(stored)
    rollouts = sorted(full.requests)
    assert len(rollouts) > STEPS * SHOWN
    with open_store(run_dir, readonly=True) as store:
        for v in range(STEPS + 1):
            assert query_events(store, "run", "version", v).version(v) == full.version(v)
        for s in range(1, STEPS + 1):
            assert query_events(store, "run", "step", s).step(s) == full.step(s)
        for rid in rollouts:
            assert query_events(store, "run", "rollout", rid).rollout(rid) == full.rollout(rid)
        for what, n, message in [("rollout", rollouts[-1] + 1, f"requested rollouts: 0..{rollouts[-1]}$"),
                                 ("version", STEPS + 1, f"published versions: 0..{STEPS}$"),
                                 ("step", 0, f"formed batches: 1..{STEPS}$")]:
            with pytest.raises(UsageError, match=message):
                getattr(query_events(store, "run", what, n), what)(n)


def test_a_query_reads_the_spine_and_only_its_rollouts_lives(run_dir, stored):
    with open_store(run_dir, readonly=True) as store:
        prov = query_events(store, "run", "version", 5)
    batch = next(s.event for s in stored if type(s.event) is ev.BatchFormed and s.event.step == 5)
    assert set(prov.requests) == set(prov.completed) == set(prov.outcomes) == set(batch.rollout_ids)
    assert set(prov.consumed) == set(batch.rollout_ids)
    assert len(prov.published) == STEPS + 1 and len(prov.batches) == STEPS
    assert all(s.kind in SPINE for s in stored if s.seq in {seq for seq, _ in prov.batches.values()})


def _edit_row(path: str, seq: int, body: bytes | None) -> None:
    """Replace the stored body at ``seq`` (None: delete the record), digest untouched."""
    import sqlite3

    conn = sqlite3.connect(path)
    with conn:
        if body is None:
            conn.execute("DELETE FROM rlx_events WHERE seq = ?", (seq,))
        else:
            conn.execute("UPDATE rlx_events SET body = ? WHERE seq = ?", (body, seq))
    conn.close()


@pytest.mark.parametrize("edit", ["flip", "delete"])
def test_an_altered_or_missing_record_is_refused(run_dir, stored, tmp_path, edit, capsys):
    import shutil

    shutil.copy(f"{run_dir}/ledger.db", tmp_path / "ledger.db")
    batch_seq, batch = next((s.seq, s.event) for s in stored if type(s.event) is ev.BatchFormed and s.event.step == 4)
    outcome_seq = next(s.seq for s in stored if type(s.event) is ev.OutcomeRecorded
                       and s.event.rollout_id == batch.rollout_ids[0])
    if edit == "flip":  # one byte of an outcome the query reads: its chain link no longer holds
        with open_store(run_dir, readonly=True) as store:
            (record,) = store.scan("run", outcome_seq, outcome_seq)
        body = record.body.replace(b"sim", b"sjm")
        assert body != record.body
        _edit_row(str(tmp_path / "ledger.db"), outcome_seq, body)
        where = outcome_seq
    else:  # an event far from the query's rollouts: the count of records shows the gap
        _edit_row(str(tmp_path / "ledger.db"), 2, None)
        where = None
    with open_store(str(tmp_path), readonly=True) as store, pytest.raises(CorruptLedger) as caught:
        query_events(store, "run", "version", 4)
    if where is not None:
        assert caught.value.seq == where
    assert main(["audit", str(tmp_path), "version", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ledger corrupt: run 'run'" in err
    assert batch_seq > outcome_seq


def test_long_lists_are_summarised_and_all_lists_them(run_dir, stored, capsys):
    full = Provenance.from_events(stored).version(STEPS)
    chain, rows = full["parent_chain"], full["rollouts"]
    assert main(["audit", run_dir, "version", str(STEPS)]) == 0
    short = capsys.readouterr().out
    assert f"… {len(chain) - SHOWN} more versions (--all lists every one)" in short
    assert f"… {len(rows) - SHOWN} more rollouts (--all lists every one)" in short
    shown_links = [link["version"] for link in chain if link["digest"][:40] in short]
    assert shown_links == [link["version"] for link in chain[: SHOWN - 1]] + [0]
    passed = sum(1 for r in rows if r["passed"])
    assert f"batch: {len(rows)} rollouts, {passed} of {len(rows)} scored passed" in short
    assert main(["audit", run_dir, "version", str(STEPS), "--all"]) == 0
    every = capsys.readouterr().out
    assert "more versions" not in every and "more rollouts" not in every
    assert all(link["digest"][:40] in every for link in chain)
    assert every.count("\n") > short.count("\n") + len(chain) - SHOWN
    assert main(["audit", run_dir, "version", str(STEPS), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["version"]
    assert len(doc["parent_chain"]) == STEPS + 1 and len(doc["rollouts"]) == len(rows)


def test_the_layout_reads_its_kinds_alone_and_checks_them(run_dir, stored, tmp_path, capsys):
    from runtime.audit.index import read_kinds

    with open_store(run_dir, readonly=True) as store:
        read = read_kinds(store, "run", ("RunStarted", "WorkerJoined"))
    assert read == [s for s in stored if s.kind in ("RunStarted", "WorkerJoined")] and len(read) > 1
    assert main(["audit", run_dir, "layout", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["run_id"] == "run" and doc["layout"] is None  # a run from before layouts: nothing recorded
    import shutil

    shutil.copy(f"{run_dir}/ledger.db", tmp_path / "ledger.db")
    joined = next(s.seq for s in stored if s.kind == "WorkerJoined")
    with open_store(run_dir, readonly=True) as store:
        (record,) = store.scan("run", joined, joined)
    _edit_row(str(tmp_path / "ledger.db"), joined, record.body[:-1] + bytes([record.body[-1] ^ 1]))
    assert main(["audit", str(tmp_path), "layout"]) == 2
    assert "ledger corrupt: run 'run'" in capsys.readouterr().err
