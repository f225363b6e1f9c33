"""``rlx curate`` over real ledgers (SQLite, PostgreSQL): per-prompt pass rates checked against
a count made by hand over the events, the band keeps only mixed outcomes, and Beam's
multi-processing mode writes the same files."""

from __future__ import annotations

import json
import os

import pytest

from ledger import events as ev
from ledger import open_store
from runtime.cli import main
from tests.ledger.test_pipelines import _ledger
from tests.runtime.controller.golden.regenerate import HERE, load


def _lines(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def _by_hand(events, versions=range(10**9)) -> dict[int, dict]:
    """Per prompt index: sampled and scored rollouts, passes and versions, first outcome wins."""
    requested = {}
    for e in events:
        if type(e) is ev.RolloutRequested:
            for q in e.samples():
                requested[q.rollout_id] = (q.prompt_index, q.policy_version)
    out: dict[int, dict] = {}
    for prompt, version in requested.values():
        if version in versions:
            c = out.setdefault(prompt, {"sampled": 0, "rollouts": 0, "passed": 0, "versions": set()})
            c["sampled"] += 1
            c["versions"].add(version)
    seen = set()
    for e in events:
        if type(e) is ev.OutcomeRecorded and e.rollout_id not in seen:
            seen.add(e.rollout_id)
            prompt, version = requested[e.rollout_id]
            if version in versions:
                out[prompt]["rollouts"] += 1
                out[prompt]["passed"] += e.passed
    return out


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    """The filtered controller history in a SQLite ledger, curated with the default band."""
    tmp = tmp_path_factory.mktemp("curate")
    events = load(HERE / "deterministic_k0_filtered.msgpack")
    path = _ledger(tmp, events)
    out = str(tmp / "curated.jsonl")
    assert main(["curate", path, "--out", out, "--json"]) == 0
    return events, path, out


def test_pass_rates_are_counted_per_prompt_and_only_mixed_outcomes_are_kept(golden, capsys):
    events, _, out = golden
    stats, want = _lines(out + ".stats.jsonl"), _by_hand(events)
    assert [s["prompt_index"] for s in stats] == sorted(want)
    for s in stats:
        w = want[s["prompt_index"]]
        assert (s["sampled"], s["rollouts"], s["passed"], s["versions"]) == (
            w["sampled"], w["rollouts"], w["passed"], sorted(w["versions"]))
        assert s["pass_rate"] == w["passed"] / w["rollouts"]
        assert s["kept"] == (0 < w["passed"] < w["rollouts"])
    kept = [s["prompt_index"] for s in stats if s["kept"]]
    assert kept and len(kept) < len(stats)  # the history has never-solved prompts too
    from runtime.audit.text import RunText

    text = RunText(events[0].config)  # arithmetic: rows are the task's own problems
    rows = _lines(out)
    assert [r["prompt"] for r in rows] == [text.prompt(i) for i in kept]
    a, b = (int(x) for x in rows[0]["prompt"].rstrip("=").split("+"))
    assert rows[0]["answer"] == str(a + b) and set(rows[0]) == {"prompt", "answer"}


def test_versions_and_band_choose_rollouts_and_prompts(golden, tmp_path):
    events, path, _ = golden
    out = str(tmp_path / "v.jsonl")
    assert main(["curate", path, "--out", out, "--versions", "1:2", "--min-pass", "0", "--max-pass", "0.5",
                 "--stats", str(tmp_path / "s.jsonl")]) == 0
    want = _by_hand(events, range(1, 3))
    stats = _lines(tmp_path / "s.jsonl")
    assert {s["prompt_index"]: (s["sampled"], s["rollouts"], s["passed"]) for s in stats} == {
        p: (w["sampled"], w["rollouts"], w["passed"]) for p, w in want.items()}
    assert [s["prompt_index"] for s in stats if s["kept"]] == sorted(
        p for p, w in want.items() if w["rollouts"] and w["passed"] / w["rollouts"] <= 0.5)
    assert all(set(s["versions"]) <= {1, 2} for s in stats)
    assert len(_lines(out)) == sum(s["kept"] for s in stats)


@pytest.mark.slow
def test_multi_processing_writes_the_same_files(golden, tmp_path, monkeypatch):
    _, path, out = golden
    monkeypatch.setenv("RLX_ALLOW_BEAM_GRPC", "1")  # the mode opens Beam's gRPC ports on every interface
    mp = str(tmp_path / "mp.jsonl")
    assert main(["curate", path, "--out", mp, "--range-events", "17", "--", "--runner=DirectRunner",
                 "--direct_running_mode=multi_processing", "--direct_num_workers=2"]) == 0
    for suffix in ("", ".stats.jsonl"):
        with open(out + suffix, "rb") as a, open(mp + suffix, "rb") as b:
            assert a.read() == b.read()


@pytest.mark.parametrize("options", [["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
                                     ["--direct_running_mode=multi_threading"], ["--runner=PortableRunner"]])
def test_a_mode_that_opens_beams_grpc_ports_is_refused_unless_allowed(golden, tmp_path, monkeypatch, capsys, options):
    _, path, _ = golden
    monkeypatch.delenv("RLX_ALLOW_BEAM_GRPC", raising=False)
    out = tmp_path / "c.jsonl"
    assert main(["curate", path, "--out", str(out), "--", *options]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "starts Beam's gRPC servers on every network interface with no token" in err[0]
    assert options[0].split("=")[0] in err[0] and "RLX_ALLOW_BEAM_GRPC=1" in err[0]
    assert not os.path.exists(out) and not os.path.exists(str(out) + ".stats.jsonl")


def test_postgresql_ledger_gives_the_same_files(golden, pg_url, tmp_path):
    events, _, out = golden
    with open_store(pg_url, create=True) as store:
        store.create_run("golden")
        epoch = store.acquire_epoch("golden")
        store.append("golden", events, expected_seq=0, epoch=epoch)
    pg = str(tmp_path / "pg.jsonl")
    assert main(["curate", pg_url, "--run", "golden", "--out", pg, "--range-events", "40"]) == 0
    for suffix in ("", ".stats.jsonl"):
        with open(out + suffix, "rb") as a, open(pg + suffix, "rb") as b:
            assert a.read() == b.read()


@pytest.mark.parametrize("args, message", [
    (["--min-pass", "abc"], "--min-pass 'abc' is not accepted"),
    (["--max-pass", "1.5"], "--max-pass 1.5 is not accepted"),
    (["--min-pass", "0.8", "--max-pass", "0.2"], "--min-pass 0.8 is above --max-pass 0.2"),
    (["--run", "nope"], "no run 'nope'"),
    (["--versions", "a:b"], "--versions 'a:b' is not accepted"),
    (["--out", "EXISTING"], "exists; choose another path or pass --force"),
])
def test_bad_input_is_one_line(golden, tmp_path, capsys, args, message):
    _, path, out = golden
    args = [out if a == "EXISTING" else a for a in args]
    argv = ["curate", path, *args] if "--out" in args else ["curate", path, "--out", str(tmp_path / "x.jsonl"), *args]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "x.jsonl").exists()
