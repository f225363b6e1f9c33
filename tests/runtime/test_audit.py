"""``rlx audit`` on a small real run: provenance answers by value, and edited ledgers caught.

The run: 3 steps, 2 groups of 4 samples per batch, max_staleness 1, keep_newest 1 (deterministic
mode). So group ``g`` holds rollouts ``4g .. 4g+3``; batch ``s`` takes groups ``2s-2, 2s-1``;
batches 1 and 2 are sampled from version 0, batch 3 from version 1; a rollout of version ``v``
consumed by step ``s`` has staleness ``(s-1) - v``: 0 in step 1, 1 in steps 2 and 3.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil

import numpy as np
import pytest

from ledger import events as ev
from ledger import open_store
from ledger.store import StoredEvent
from runtime import rng
from runtime.audit import Provenance, Violation, check_run
from runtime.cli import main
from runtime.errors import UsageError
from runtime.params import ParamStore
from runtime.session import make_task
from tests.ledger.readonly_mount import rlx_readonly, unavailable
from tests.runtime.small_run import SEED


@pytest.fixture(scope="module")
def finished(small_run):
    """(run directory, summary, config) of the shared small run."""
    return small_run


@pytest.fixture(scope="module")
def events(finished):
    with open_store(finished[0]) as store:
        return list(store.read("run"))


def one(events, kind, **fields):
    """(seq, event) of the only event of ``kind`` with ``fields``."""
    (found,) = [(s.seq, s.event) for s in events if isinstance(s.event, kind)
                and all(getattr(s.event, k) == v for k, v in fields.items())]
    return found


def completion_of(events, rollout_id):
    """The completion of ``rollout_id``."""
    return next(s.event for s in events if isinstance(s.event, ev.RolloutCompleted) and s.event.rollout_id == rollout_id)


def copy_ledger(events, dst, edit) -> str:
    """A run directory (ledger only) holding ``edit(event)`` of every event, on a new valid chain."""
    os.makedirs(dst, exist_ok=True)
    with open_store(f"{dst}/ledger.db", create=True) as store:
        store.create_run("run")
        epoch = store.acquire_epoch("run")
        store.append("run", [edit(s.event) for s in events], expected_seq=0, epoch=epoch)
    return str(dst)


@pytest.mark.slow
def test_version_lineage(finished, events):
    _, summary, config = finished
    task = make_task(config)
    prov = Provenance.from_events(events)
    doc = prov.version(3, prompt_text=lambda i: task.problem("train", i).prompt)
    digests = {v: one(events, ev.WeightsPublished, version=v)[1].digest for v in range(4)}
    assert (doc["version"], doc["digest"], doc["retired_seq"]) == (3, summary["final_digest"], None)
    assert [(link["version"], link["digest"]) for link in doc["parent_chain"]] == [(v, digests[v]) for v in (3, 2, 1, 0)]
    step = doc["step"]
    assert (step["group_ids"], step["rollout_ids"]) == ([4, 5], list(range(16, 24)))
    assert (step["policy_versions"], step["staleness_max"], step["staleness_mean"]) == ([1], 1, 1.0)
    assert step["parent"] == {"version": 2, "digest": digests[2]}
    assert step["metrics"] == one(events, ev.TrainStepCompleted, step=3)[1].metrics
    assert step["produced"]["digest"] == digests[3]
    assert [r["rollout_id"] for r in doc["rollouts"]] == list(range(16, 24))
    for r in doc["rollouts"]:
        ordinal, sample = divmod(r["rollout_id"] - 16, 4)
        _, outcome = one(events, ev.OutcomeRecorded, rollout_id=r["rollout_id"])
        assert (r["group_id"], r["batch"], r["policy_version"], r["staleness"]) == (4 + ordinal, 3, 1, 1)
        assert r["seed"] == rng.rollout_seed(SEED, 3, ordinal, sample)
        assert r["sampling"] == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_tokens": 4}
        assert (r["worker"], r["attempts"]) == ("inference-0", 1)
        assert re.fullmatch(r"[0-4]\+[0-4]=", r["prompt"])
        assert r["prompt"] == task.problem("train", r["prompt_index"]).prompt
        assert (r["reward"], r["passed"], r["verdict"]) == (outcome.reward, outcome.passed, outcome.verdict)
        assert r["verifier"] == "math" and r["verifier_version"] == outcome.verifier_version
    # keep_newest 1 is resolved to max_staleness + 1 = 2: nothing this short run needs is retired.
    assert not any(isinstance(s.event, ev.VersionsRetired) for s in events)
    assert prov.version(1)["retired_seq"] is None
    v0 = prov.version(0)
    assert v0["step"] is None and v0["rollouts"] == [] and v0["parent_chain"] == [
        {"version": 0, "digest": digests[0], "seq": one(events, ev.WeightsPublished, version=0)[0]}]
    assert "200 supervised warm-start steps" in v0["origin"]


@pytest.mark.slow
def test_rollout_history_and_step(events):
    prov = Provenance.from_events(events)
    doc = prov.rollout(5)  # group 1 of batch 1, sample 1
    expected = [
        ("requested", next(s.seq for s in events if isinstance(s.event, ev.RolloutRequested) and 5 in s.event.rollout_ids)),
        ("assigned", next(s.seq for s in events if isinstance(s.event, ev.RolloutAssigned) and 5 in s.event.rollout_ids)),
        ("completed", one(events, ev.RolloutCompleted, rollout_id=5)[0]),
        ("scored", one(events, ev.OutcomeRecorded, rollout_id=5)[0]),
        ("consumed", one(events, ev.BatchFormed, step=1)[0]),
        ("trained", one(events, ev.TrainStepCompleted, step=1)[0]),
        ("published", one(events, ev.WeightsPublished, version=1)[0]),
    ]
    assert [(h["event"], h["seq"]) for h in doc["history"]] == expected
    assert [e for e, _ in expected] == [h["event"] for h in sorted(doc["history"], key=lambda h: h["seq"])]
    assert (doc["group_id"], doc["batch"], doc["policy_version"], doc["staleness"]) == (1, 1, 0, 0)
    assert doc["seed"] == rng.rollout_seed(SEED, 1, 1, 1)
    assert doc["consumed_by_step"] == 1 and doc["discarded"] is None
    assert doc["produced_version"] == {"version": 1, "digest": one(events, ev.WeightsPublished, version=1)[1].digest,
                                       "seq": expected[-1][1]}
    assert (prov.rollout(20)["consumed_by_step"], prov.rollout(20)["staleness"]) == (3, 1)
    step = prov.step(2)
    assert (step["group_ids"], step["policy_versions"], step["staleness_max"]) == ([2, 3], [0], 1)
    assert step["produced"]["version"] == 2 and step["parent"]["version"] == 1


@pytest.mark.slow
def test_unknown_queries_and_bad_directories_are_one_line_errors(finished, events, tmp_path, capsys):
    out = finished[0]
    prov = Provenance.from_events(events)
    with pytest.raises(UsageError, match=r"^version 9 is not in this run; published versions: 0\.\.3$"):
        prov.version(9)
    with pytest.raises(UsageError, match=r"^rollout 24 is not in this run; requested rollouts: 0\.\.23$"):
        prov.rollout(24)
    with pytest.raises(UsageError, match=r"^step 0 is not in this run; formed batches: 1\.\.3$"):
        prov.step(0)
    for argv, message in [
        (["audit", out, "version", "9"], "version 9 is not in this run"),
        (["audit", str(tmp_path), "check"], "has no ledger.db"),
        (["audit", str(tmp_path / "absent"), "version", "1"], "is not a run directory"),
        (["audit", out, "step", "1", "--run", "other"], "--run 'other': no such run"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("rlx: error: ") and message in err


@pytest.mark.slow
def test_cli_tables_and_json(finished, capsys):
    out, summary, _ = finished
    assert main(["audit", out, "version", "3"]) == 0
    text = capsys.readouterr().out
    assert "parent chain" in text and "rollouts of the batch" in text and summary["final_digest"][:16] in text
    assert main(["audit", out, "rollout", "5", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["run_id"] == "run" and doc["rollout"]["consumed_by_step"] == 1
    assert re.fullmatch(r"[0-4]\+[0-4]=", doc["rollout"]["prompt"])


@pytest.mark.slow
def test_check_passes_on_the_finished_run(finished, events, capsys):
    out = finished[0]
    stored = {v: ParamStore.open(f"{out}/params").verify(v) for v in (0, 1, 2, 3)}
    assert check_run(events, stored=stored) == []
    assert main(["audit", out, "check", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["ok"], doc["params_checked"], doc["violations"], doc["events"]) == (True, True, [], len(events))


@pytest.mark.slow
def test_check_catches_a_rollout_consumed_twice(events, tmp_path, capsys):
    # Batch 2 takes rollout 0, already consumed by batch 1, in place of its own rollout 8.
    def edit(e):
        if isinstance(e, ev.BatchFormed) and e.step == 2:
            return dataclasses.replace(e, rollout_ids=(0, *e.rollout_ids[1:]))
        return e

    edited = copy_ledger(events, tmp_path, edit)
    seq = one(events, ev.BatchFormed, step=2)[0]
    with open_store(edited) as store:
        violations = check_run(store.read("run"))
    assert Violation("I2", seq, "batch 2 consumes rollout 0 again (first by batch 1)") in violations
    assert main(["audit", edited, "check", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["params_absent"] == f"no parameter store at {edited}/params"
    assert {"invariant": "I2", "seq": seq, "kind": "BatchFormed",
            "message": "batch 2 consumes rollout 0 again (first by batch 1)"} in doc["violations"]
    assert main(["audit", edited, "check"]) == 1
    assert "consumes rollout 0 again" in capsys.readouterr().out


@pytest.mark.slow
def test_check_catches_consumption_beyond_the_staleness_bound(events, tmp_path):
    # The same batches under a recorded bound of 0: batch 2's rollouts (version 0, step 2) are 1 stale.
    def edit(e):
        if isinstance(e, ev.RunStarted):
            config = {**e.config, "scheduling": {**e.config["scheduling"], "max_staleness": 0}}
            return dataclasses.replace(e, config=config)
        return e

    edited = copy_ledger(events, tmp_path, edit)
    seq = one(events, ev.BatchFormed, step=2)[0]
    with open_store(edited) as store:
        violations = check_run(store.read("run"))
    stale = [v for v in violations if v.invariant == "I1"]
    assert stale[:8] == [Violation("I1", seq, f"rollout {r} of version 0 used in step 2: staleness 1 > 0")
                         for r in range(8, 16)]


@pytest.mark.slow
def test_check_reports_a_deleted_parameter_version(finished, events, tmp_path, capsys):
    bad = str(tmp_path / "bad")
    shutil.copytree(finished[0], bad)
    ParamStore.open(f"{bad}/params").delete(3)
    assert main(["audit", bad, "check", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["violations"] == [{
        "invariant": "I8", "seq": one(events, ev.WeightsPublished, version=3)[0], "kind": "WeightsPublished",
        "message": "version 3 is retained by the ledger but missing from the parameter store",
    }]


def _stored(events):
    return [StoredEvent("run", seq, e, b"", 1, 0.0) for seq, e in enumerate(events, start=1)]


def test_history_of_a_leased_twice_rollout_whose_group_was_discarded():
    sampling = {"max_tokens": 4}
    events = _stored([
        ev.RunStarted("run", {"pretrain": {"steps": 0}}, "c" * 64, 5),
        ev.WeightsPublished(0, "a" * 64, -1, ""),
        ev.RolloutRequested((0,), 0, 1, 17, 0, (99,), sampling),
        ev.RolloutAssigned("w1", (0,), (0,)),
        ev.RolloutAbandoned(0, 0, "lease expired"),
        ev.RolloutAssigned("w2", (0,), (1,)),
        ev.RolloutCompleted(0, "w2", 1, 0, "a" * 64, np.array([3, 4], np.int32), np.zeros(2, np.float32), "stop"),
        ev.OutcomeRecorded(0, 0.0, False, "WA", "math", "math/1"),
        ev.GroupDiscarded(0, "uniform_reward"),
    ])
    doc = Provenance.from_events(events).rollout(0, prompt_text=lambda i: f"prompt {i}")
    assert [(h["seq"], h["event"], h["detail"]) for h in doc["history"]] == [
        (3, "requested", "group 0 of batch 1, prompt 17, version 0, seed 99"),
        (4, "assigned", "to w1, attempt 0"),
        (5, "abandoned", "attempt 0: lease expired"),
        (6, "assigned", "to w2, attempt 1"),
        (7, "completed", "by w2, attempt 1, 2 tokens, stop, weights " + "a" * 16),
        (8, "scored", "reward 0.0, failed (WA) by math math/1"),
        (9, "discarded", "group 0: uniform_reward"),
    ]
    assert (doc["attempts"], doc["worker"], doc["prompt"], doc["tokens"]) == (2, "w2", "prompt 17", 2)
    assert (doc["consumed_by_step"], doc["staleness"], doc["produced_version"], doc["discarded"]) == (
        None, None, None, "uniform_reward")
    v0 = Provenance.from_events(events).version(0)
    assert v0["origin"] == "initial weights: built-in model, seed 5, 0 supervised warm-start steps"


@pytest.mark.slow
def test_diff_of_a_copy_is_identical_and_names_config_differences(finished, events, tmp_path, capsys):
    out, _, config = finished
    same = copy_ledger(events, tmp_path / "same", lambda e: e)
    assert main(["audit", out, "diff", same]) == 0
    assert "identical: 4 common versions and 24 common rollouts, bit for bit" in capsys.readouterr().out

    def reseed(e):
        return dataclasses.replace(e, config={**e.config, "run": {**e.config["run"], "seed": 99}}) \
            if isinstance(e, ev.RunStarted) else e

    other = copy_ledger(events, tmp_path / "reseeded", reseed)
    assert main(["audit", out, "diff", other, "--json"]) == 0  # the ledgers agree past the config
    doc = json.loads(capsys.readouterr().out)
    assert doc["config_differences"] == {"run.seed": [config.run.seed, 99]} and doc["identical"]


@pytest.mark.slow
def test_diff_finds_a_sample_that_parted_under_identical_weights(finished, events, tmp_path, capsys):
    out = finished[0]

    def flip(e):  # rollout 9 (batch 2, from version 0): its second token differs
        if isinstance(e, ev.RolloutCompleted) and e.rollout_id == 9:
            tokens = e.tokens.copy()
            tokens[1] += 1
            return dataclasses.replace(e, tokens=tokens)
        return e

    edited = copy_ledger(events, tmp_path / "flipped", flip)
    assert main(["audit", out, "diff", edited, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["first_divergent_version"] is None and not doc["identical"]
    r = doc["first_divergent_rollout"]
    assert (r["rollout_id"], r["field"], r["position"], r["policy_version"], r["weights_same"]) == (9, "tokens", 1, 0, True)
    assert main(["audit", out, "diff", edited]) == 1
    assert "the sampler parted, not training" in capsys.readouterr().out

    def nudge(e):  # the same tokens, the last log-prob one float32 step away
        if isinstance(e, ev.RolloutCompleted) and e.rollout_id == 9:
            logprobs = e.logprobs.copy()
            logprobs[-1] = np.nextafter(logprobs[-1], np.float32(0))
            return dataclasses.replace(e, logprobs=logprobs)
        return e

    assert main(["audit", out, "diff", copy_ledger(events, tmp_path / "nudged", nudge), "--json"]) == 1
    r = json.loads(capsys.readouterr().out)["first_divergent_rollout"]
    assert (r["rollout_id"], r["field"], r["position"]) == (9, "logprobs", len(completion_of(events, 9).logprobs) - 1)
    assert 0 < r["max_abs_delta"] < 1e-6


@pytest.mark.slow
def test_diff_finds_the_first_version_and_says_its_inputs_were_the_same(finished, events, tmp_path, capsys):
    out = finished[0]

    def redigest(e):  # as if step 2 had given other bits from the same parent and batch
        if isinstance(e, ev.WeightsPublished) and e.version >= 2:
            return dataclasses.replace(e, digest="f" * 64)
        return e

    edited = copy_ledger(events, tmp_path / "redigested", redigest)
    assert main(["audit", out, "diff", edited, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    v = doc["first_divergent_version"]
    assert (v["version"], v["digest_b"], doc["versions_identical"]) == (2, "f" * 64, 2)
    assert (v["cause"]["step"], v["cause"]["parent_same"], v["cause"]["batch_same"]) == (2, True, True)
    assert "the train step itself" in v["cause"]["message"]
    # Rollouts sampled from version 2 onwards would now come from other weights: none differs here.
    assert doc["first_divergent_rollout"] is None


@pytest.mark.slow
def test_check_reports_every_retained_version_when_the_parameter_store_is_gone(finished, events, tmp_path, capsys):
    gone = str(tmp_path / "gone")
    shutil.copytree(finished[0], gone)
    shutil.rmtree(f"{gone}/params")
    published = {v: one(events, ev.WeightsPublished, version=v)[0] for v in range(4)}
    assert main(["audit", gone, "check", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert (doc["ok"], doc["params_checked"]) == (False, True)
    assert doc["violations"] == [{
        "invariant": "I8", "seq": seq, "kind": "WeightsPublished",
        "message": f"version {v} is retained by the ledger but missing from the parameter store "
                   f"(no parameter store at {gone}/params)",
    } for v, seq in published.items()]
    assert main(["audit", gone, "check"]) == 1
    text = capsys.readouterr().out
    assert all(f"version {v} is retained" in text for v in range(4))


@pytest.mark.slow
def test_check_reports_weights_whose_digest_is_not_the_ledgers(finished, events, tmp_path, capsys):
    swapped = str(tmp_path / "swapped")
    shutil.copytree(finished[0], swapped)
    pstore = ParamStore.open(f"{swapped}/params")
    params = pstore.get(2)
    pstore.delete(2)
    pstore.put(2, nudged(params))  # a well-formed version 2, but not the ledger's weights
    seq, published = one(events, ev.WeightsPublished, version=2)
    assert main(["audit", swapped, "check", "--json"]) == 1
    (row,) = json.loads(capsys.readouterr().out)["violations"]
    assert (row["invariant"], row["seq"]) == ("I8", seq)
    assert row["message"].startswith("version 2: stored weights have digest ")
    assert row["message"].endswith(f"the ledger says {published.digest[:16]}…")


def nudged(tree):
    """``tree`` with the first element of its first array leaf moved one float step."""
    done = False

    def nudge(x):
        nonlocal done
        if isinstance(x, dict):
            return {k: nudge(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(nudge(v) for v in x)
        if isinstance(x, np.ndarray) and x.size and not done and np.issubdtype(x.dtype, np.floating):
            done = True
            y = x.copy()
            y.flat[0] = np.nextafter(y.flat[0], np.inf, dtype=y.dtype)
            return y
        return x

    out = nudge(tree)
    assert done
    return out


@pytest.mark.slow
@pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
def test_audit_and_replay_work_on_a_read_only_mount(finished, events, tmp_path):
    mount = tmp_path / "ro"
    a, b = str(mount / "a"), str(mount / "b")
    shutil.copytree(finished[0], a)
    shutil.copytree(finished[0], b)
    done = rlx_readonly(mount, "audit", a, "check", "--json")
    assert done.returncode == 0, done.stderr
    assert (json.loads(done.stdout)["ok"], json.loads(done.stdout)["params_absent"]) == (True, None)
    done = rlx_readonly(mount, "audit", a, "version", "3", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["version"]["digest"] == finished[1]["final_digest"], done.stderr
    done = rlx_readonly(mount, "audit", a, "diff", b, "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["identical"], done.stderr
    done = rlx_readonly(mount, "replay", a, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["final_digest"] == finished[1]["final_digest"]
