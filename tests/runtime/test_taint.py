"""``rlx audit DIR taint --verifier NEW``: the outcomes another scorer judges otherwise, the steps
that consumed them and the versions downstream, on hand-made histories (by value) and on real
runs whose verifier had an injected bug (a math run scored by a reward file that flips a known
2%, the same run on a PostgreSQL ledger, and a code run whose recorded outcomes were flipped)."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

from ledger import events as ev
from ledger import open_store
from ledger.store import StoredEvent
from runtime.audit import Provenance
from runtime.audit.taint import BUILTIN, scoring_config, taint, taint_run
from runtime.cli import main
from runtime.config import Config
from runtime.errors import UsageError
from runtime.rundir import write_run_pointer
from tests.runtime import small_run

# -- the pure core on a hand-made history ---------------------------------------------------
#
# Groups 0..4 of two rollouts (2g, 2g+1); group g sampled from version max(0, g - 1); step s
# (1..4) consumes group s - 1 and produces version s from version s - 1; group 4 is never
# consumed.

POLICY = {0: 0, 1: 0, 2: 1, 3: 2, 4: 3}


def _history() -> list[StoredEvent]:
    events: list[ev.Event] = [ev.RunStarted("run", {}, "", 0), ev.WeightsPublished(0, "d0", -1, "")]
    for g, v in POLICY.items():
        events.append(ev.RolloutRequested((2 * g, 2 * g + 1), g, g + 1, 10 + g, v, (0, 1), {}))
        for rid in (2 * g, 2 * g + 1):
            events.append(ev.RolloutCompleted(rid, "w", 1, v, f"d{v}", np.array([1, 2], np.int32),
                                              np.zeros(2, np.float32), "length"))
            events.append(ev.OutcomeRecorded(rid, 1.0 if rid % 2 else 0.0, bool(rid % 2), "AC" if rid % 2 else "WA",
                                             "math", "math/2"))
    for s in range(1, 5):
        g = s - 1
        events.append(ev.BatchFormed(s, (g,), (2 * g, 2 * g + 1), (POLICY[g], POLICY[g])))
        events.append(ev.WeightsPublished(s, f"d{s}", s - 1, f"d{s - 1}"))
    return [StoredEvent("run", seq, e, b"", 1, 0.0) for seq, e in enumerate(events, 1)]


def _recorded(events) -> dict[int, ev.OutcomeRecorded]:
    return {s.event.rollout_id: s.event for s in events if isinstance(s.event, ev.OutcomeRecorded)}


def test_a_changed_reward_taints_its_step_and_every_version_trained_after_it():
    events = _history()
    new = {rid: ev.OutcomeRecorded(rid, o.reward, o.passed, o.verdict, "math", "math/3")
           for rid, o in _recorded(events).items()}
    new[5] = ev.OutcomeRecorded(5, 0.0, False, "WA", "math", "math/3")  # group 2: step 3
    new[8] = ev.OutcomeRecorded(8, 1.0, True, "AC", "math", "math/3")  # group 4: consumed by no step
    doc = taint(Provenance.from_events(events), new)
    assert doc["rejudged"] == 10
    assert doc["recorded_verifiers"] == [{"verifier": "math", "version": "math/2", "outcomes": 10}]
    assert doc["new_verifiers"] == [{"verifier": "math", "version": "math/3", "outcomes": 10}]
    assert [(c["rollout_id"], c["prompt_index"], c["policy_version"], c["consumed_by_step"]) for c in doc["changed"]] == [
        (5, 12, 1, 3), (8, 14, 3, None)]
    assert doc["changed"][0]["recorded"] == {"reward": 1.0, "passed": True, "verdict": "AC", "verifier": "math",
                                             "verifier_version": "math/2"}
    assert doc["changed"][0]["new"]["verdict"] == "WA" and doc["changed"][0]["new"]["verifier_version"] == "math/3"
    assert (doc["reward_changed"], doc["unconsumed_changed"]) == (2, 1)
    assert doc["steps"] == [{"step": 3, "changed_rollouts": [5], "batch_rollouts": 2, "produced_version": 3}]
    assert [(v["version"], v["trained_on_changed"], v["parent_tainted"], v["sampled_rollouts"])
            for v in doc["versions"]] == [(3, True, False, 2), (4, False, True, 0)]
    assert (doc["first_tainted_version"], doc["versions_published"]) == (3, 5)
    assert doc["sampled_from_tainted"] == 2  # group 4, sampled from version 3


def test_a_verdict_that_changes_without_its_reward_still_counts_and_nothing_else_does():
    events = _history()
    new = dict(_recorded(events))
    same = taint(Provenance.from_events(events), new)
    assert same["changed"] == [] and same["steps"] == [] and same["first_tainted_version"] is None
    new[0] = ev.OutcomeRecorded(0, 0.0, False, "PARSE_ERROR", "math", "math/2")  # WA before, reward 0 both times
    del new[9]  # not judged again: not compared
    doc = taint(Provenance.from_events(events), new)
    assert [c["rollout_id"] for c in doc["changed"]] == [0] and doc["reward_changed"] == 0
    assert doc["rejudged"] == 9 and [s["step"] for s in doc["steps"]] == [1]
    assert [v["version"] for v in doc["versions"]] == [1, 2, 3, 4] and doc["first_tainted_version"] == 1
    assert doc["sampled_from_tainted"] == 6  # groups 2, 3, 4 (versions 1, 2, 3)


def test_the_verifier_named_is_checked(tmp_path):
    config = Config.from_dict({"verifier": {"reward": "/x/mine.py", "reward_digest": "0" * 64}})
    assert scoring_config(config, BUILTIN).verifier.reward is None
    assert scoring_config(config, BUILTIN).verifier.reward_digest is None
    other = tmp_path / "other.py"
    other.write_text("def score(prompt, completion, answer):\n    return 0.0\n", encoding="utf-8")
    named = scoring_config(config, f"{other}:score").verifier
    assert (named.reward, named.reward_digest) == (f"{other}:score", None)
    with pytest.raises(UsageError, match=r"^--verifier 'math/3': give 'builtin' .* or a reward file, FILE.py"):
        scoring_config(config, "math/3")
    with pytest.raises(UsageError) as refused:
        scoring_config(config, f"{other}:reward")
    assert str(refused.value) == (f"--verifier '{other}:reward': {other} defines no function 'reward' at its top "
                                  "level; define reward(prompt, completion, answer) returning a number")


# -- real runs ---------------------------------------------------------------------------------

BUGGY = '''
import hashlib


def reward(prompt, completion, answer):
    """Right for the exact sum, except a fixed 2% of (prompt, completion) pairs whose verdict flips."""
    right = 1.0 if completion.strip() == answer else 0.0
    if int(hashlib.sha256(f"{prompt}\\x00{completion}".encode()).hexdigest(), 16) % 50 == 0:
        return 1.0 - right
    return right
'''
RIGHT = '''
def reward(prompt, completion, answer):
    return 1.0 if completion.strip() == answer else 0.0
'''


def _flipped(prompt: str, completion: str) -> bool:
    """The injected bug's choice, as ``BUGGY`` makes it."""
    return int(hashlib.sha256(f"{prompt}\x00{completion}".encode()).hexdigest(), 16) % 50 == 0


def _events(out) -> list[StoredEvent]:
    with open_store(out, readonly=True) as store:
        return list(store.read("run"))


def _of(events, kind) -> list:
    return [s.event for s in events if isinstance(s.event, kind)]


def _truth(events, bad: set[int]) -> tuple[set[int], set[int], set[int]]:
    """(outcomes, steps, versions) a bug that flipped the outcomes ``bad`` reached, from the
    history itself: the steps whose batch holds one, and every version from the first of those
    steps on (each version is trained from the one before it)."""
    steps = {b.step for b in _of(events, ev.BatchFormed) if bad & set(b.rollout_ids)}
    return bad, steps, {p.version for p in _of(events, ev.WeightsPublished) if steps and p.version >= min(steps)}


def _named(doc) -> tuple[set[int], set[int], set[int]]:
    return ({c["rollout_id"] for c in doc["changed"]}, {s["step"] for s in doc["steps"]},
            {v["version"] for v in doc["versions"]})


def _precision_recall(named: set[int], truth: set[int]) -> tuple[float, float]:
    hit = len(named & truth)
    return (hit / len(named) if named else 1.0, hit / len(truth) if truth else 1.0)


def _check_exact(doc, events, bad: set[int]) -> None:
    truth = _truth(events, bad)
    assert bad, "the injected bug flipped no outcome of this run"
    for named, true in zip(_named(doc), truth, strict=True):
        assert _precision_recall(named, true) == (1.0, 1.0), (named, true)
    assert doc["first_tainted_version"] == min(truth[2])


def _math_flipped(events) -> set[int]:
    """The outcomes ``BUGGY`` flipped, by their prompt's and completion's text."""
    from runtime.session import make_task
    from runtime.tasks.base import TextCodec

    task, codec = make_task(Config.from_dict(events[0].event.config)), TextCodec.builtin()
    prompt = {q.rollout_id: task.problem("train", q.prompt_index).prompt
              for r in _of(events, ev.RolloutRequested) for q in r.samples()}
    scored = {o.rollout_id for o in _of(events, ev.OutcomeRecorded)}
    return {c.rollout_id for c in _of(events, ev.RolloutCompleted)
            if c.rollout_id in scored and _flipped(prompt[c.rollout_id], codec.decode(c.tokens))}


@pytest.fixture(scope="module")
def buggy_run(tmp_path_factory):
    """A 4-step math run scored by ``BUGGY``; (root, run directory)."""
    root = tmp_path_factory.mktemp("taint")
    small_run.write_sums(root / "sums.jsonl")
    (root / "buggy.py").write_text(BUGGY, encoding="utf-8")
    (root / "right.py").write_text(RIGHT, encoding="utf-8")
    out = root / "run"
    argv = ["run", "--out", str(out), "--no-progress", "--steps", "4", "--data", str(root / "sums.jsonl"),
            "--set", f'pretrain.cache_dir="{root / "warm"}"', "--set", "sampling.max_tokens=4",
            "--set", f'verifier.reward="{root / "buggy.py"}"']
    for o in small_run.TINY:
        argv += ["--set", o]
    assert main(argv) == 0
    return root, str(out)


@pytest.mark.slow
def test_the_flipped_math_outcomes_their_steps_and_the_versions_after_them_exactly(buggy_run):
    root, out = buggy_run
    events = _events(out)
    right = str(root / "right.py")
    doc = taint_run(out, None, right, log=lambda m: None)
    _check_exact(doc, events, _math_flipped(events))
    digest = hashlib.sha256(RIGHT.encode()).hexdigest()
    assert doc["new_verifiers"] == [{"verifier": "reward", "version": f"sha256:{digest}", "outcomes": doc["rejudged"]}]
    assert doc["rejudged"] == len(_of(events, ev.OutcomeRecorded)) == 4 * 4 * 4
    for c in doc["changed"]:  # a 0/1 reward turned round
        assert c["reward_changed"] and c["new"]["reward"] == 1.0 - c["recorded"]["reward"]


@pytest.mark.slow
def test_rlx_audit_taint_prints_the_document_or_its_tables_and_exits_1_when_an_outcome_changed(buggy_run, capsys):
    root, out = buggy_run
    right = str(root / "right.py")
    doc = taint_run(out, None, right, log=lambda m: None)
    capsys.readouterr()
    assert main(["audit", out, "taint", "--verifier", right, "--json"]) == 1
    printed = capsys.readouterr()
    assert json.loads(printed.out) == doc and "judged 64 of 64 completions" in printed.err
    assert main(["audit", out, "taint", "--verifier", right, "--all"]) == 1
    table = " ".join(capsys.readouterr().out.split())  # as one line, however the terminal wrapped it
    first = doc["first_tainted_version"]
    assert (f"{len(doc['changed'])} outcomes changed ({len(doc['changed'])} in reward" in table
            and f"first version {first};" in table and "tainted versions" in table)
    assert main(["audit", out, "taint", "--verifier", str(root / "buggy.py"), "--json"]) == 0  # as recorded
    same = json.loads(capsys.readouterr().out)
    assert same["changed"] == [] and same["first_tainted_version"] is None
    missing = root / "missing.py"
    assert main(["audit", out, "taint", "--verifier", str(missing)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"rlx: error: --verifier {str(missing)!r}: {missing} does not exist"]


@pytest.mark.slow
@pytest.mark.postgres
def test_the_same_run_on_a_postgresql_ledger(buggy_run, pg_url, tmp_path):
    root, out = buggy_run
    events = _events(out)
    with open_store(pg_url, create=True) as store:
        store.create_run("run")
        store.append("run", [s.event for s in events], expected_seq=0, epoch=store.acquire_epoch("run"))
    moved = tmp_path / "pg_run"
    os.makedirs(moved)
    write_run_pointer(moved, pg_url, "run")
    doc = taint_run(str(moved), None, str(root / "right.py"), log=lambda m: None)
    _check_exact(doc, events, _math_flipped(events))
    assert doc == taint_run(out, None, str(root / "right.py"), log=lambda m: None)


def _flip(o: ev.OutcomeRecorded) -> ev.OutcomeRecorded:
    """What a code verifier with the bug records: the verdict and reward of ``o`` turned round."""
    return ev.OutcomeRecorded(o.rollout_id, 1.0 - o.reward, not o.passed, "WA" if o.passed else "AC", o.verifier,
                              o.verifier_version, "flipped")


def code_run(tmp_path, **sections) -> str:
    """A 3-step code-task run of 4 groups of 4 function bodies judged in the sandbox, in
    ``tmp_path / "code"`` (``sections``: more config tables); its directory."""
    from runtime.run import run
    from runtime.tasks import CodeFunctions

    generated = CodeFunctions()
    data = tmp_path / "fns.jsonl"
    data.write_text("".join(json.dumps(generated.data_row(i)) + "\n" for i in range(12)), encoding="utf-8")
    config = Config.from_dict({
        "run": {"steps": 3, "seed": 0},
        "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64},
        "pretrain": {"steps": 200, "batch_size": 32, "cache_dir": str(tmp_path / "warm")},
        "eval": {"size": 4},
        "data": {"task": "codefn", "path": str(data)},
        "sampling": {"group_size": 4, "max_tokens": 12},
        "scheduling": {"groups_per_batch": 4, "max_staleness": 1},
        "workers": {"inference_slots": 16, "mode": "threads"},
        **sections,
    })
    out = str(tmp_path / "code")
    run(config, out, progress=False, log=lambda m: None)
    return out


def flipped_outcomes(events) -> set[int]:
    """A fixed 2% of the run's scored rollouts: one in 50, the 26th first (one of step 2's batch)."""
    return set(sorted(o.rollout_id for o in _of(events, ev.OutcomeRecorded))[25::50])


def copy_events(events, url: str, flipped: set[int] = frozenset()) -> None:
    """The run's stored events into a new ledger at ``url``, the outcomes of ``flipped`` turned round."""
    with open_store(url, create=True) as store:
        store.create_run("run")
        store.append("run", [_flip(s.event) if isinstance(s.event, ev.OutcomeRecorded) and s.event.rollout_id in flipped
                             else s.event for s in events], expected_seq=0, epoch=store.acquire_epoch("run"))


@pytest.mark.slow
def test_flipped_code_outcomes_are_found_by_the_code_verifier_judging_again(tmp_path):
    out = code_run(tmp_path)
    events = _events(out)
    clean = taint_run(out, None, BUILTIN, log=lambda m: None)  # the code verifier judges as it did
    assert clean["changed"] == [] and clean["versions"] == [] and clean["first_tainted_version"] is None
    assert clean["rejudged"] == 3 * 4 * 4 and {r["verifier"] for r in clean["recorded_verifiers"]} == {"code"}
    assert clean["recorded_verifiers"] == clean["new_verifiers"]

    bad = flipped_outcomes(events)
    edited = tmp_path / "edited"
    os.makedirs(edited)
    copy_events(events, f"{edited}/ledger.db", bad)
    doc = taint_run(str(edited), None, BUILTIN, log=lambda m: None)
    _check_exact(doc, events, bad)
    assert doc["first_tainted_version"] > 1 and doc["recorded_verifiers"] == clean["recorded_verifiers"]
