"""End to end: ``rlx run`` on a tiny model — every algorithm, bad configs, resume after SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from ledger import events as ev
from ledger import open_store
from runtime.cli import main
from runtime.config import load_config
from runtime.run import run
from tests.runtime import small_run

# threads: these tests SIGKILL the run itself at failpoints (worker processes have their own tests)
TINY = ['workers.mode="threads"', *small_run.TINY]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("warm_start"))


def tiny(cache_dir: str, *extra: str):
    return load_config(None, [*TINY, f'pretrain.cache_dir="{cache_dir}"', *extra])


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["grpo", "dapo", "drgrpo", "rloo", "gspo", "cispo", "ppo", "reinforce", "dpo", "kto"])
def test_every_algorithm_runs_and_its_ledger_verifies(tmp_path, cache_dir, algorithm):
    out = str(tmp_path / "run")
    summary = run(tiny(cache_dir, "run.steps=2", f"algorithm.name=\"{algorithm}\""), out, progress=False,
                  log=lambda m: None)
    assert summary["steps"] == 2 and summary["final_version"] == 2
    assert len(summary["final_digest"]) == 64
    for m in summary["metrics"]:
        assert all(v == v for v in m.values()), f"NaN metric in {m}"  # no NaN anywhere
    with open_store(out) as store:
        assert store.verify("run").ok
        evaluated = {e.version: e for e in store.events("run") if e.KIND == "VersionEvaluated"}
    # The headline is the ledger's: the VersionEvaluated events of versions 0 and final.
    assert set(evaluated) == {0, 2}
    assert (summary["eval_before"], summary["eval_after"], summary["eval_size"]) == (
        evaluated[0].greedy_pass_rate, evaluated[2].greedy_pass_rate, evaluated[2].problems)
    assert os.path.getsize(os.path.join(out, "report.png")) > 10_000
    with open(os.path.join(out, "summary.json")) as f:
        saved = json.load(f)
    assert saved["final_digest"] == summary["final_digest"] and len(saved["reward_curve"]) == 2


@pytest.mark.slow
def test_same_config_and_seed_give_the_same_weights_and_on_policy_logprobs_match(tmp_path, cache_dir):
    config = tiny(cache_dir, "run.steps=3", "scheduling.max_staleness=0")
    a = run(config, str(tmp_path / "a"), progress=False, log=lambda m: None)
    b = run(config, str(tmp_path / "b"), progress=False, log=lambda m: None)
    assert a["final_digest"] == b["final_digest"]
    assert a["metrics"] == b["metrics"]
    for m in a["metrics"]:  # on-policy: engine and trainer log-probs of the same tokens
        assert m["logprob_mismatch_max"] <= 1e-5 and m["staleness_max"] == 0
    c = run(load_config(None, [*TINY, f'pretrain.cache_dir="{cache_dir}"', "run.steps=3", "run.seed=1",
                               "scheduling.max_staleness=0"]), str(tmp_path / "c"), progress=False, log=lambda m: None)
    assert c["final_digest"] != a["final_digest"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--set", "algorithm.name=nope"], "algorithm.name"),
        (["--set", "scheduling.max_staleness=-1"], "scheduling.max_staleness"),
        (["--model", "{tmp}/no-model"], "no-model"),
        (["--data", "{tmp}/bad.jsonl"], "bad.jsonl:2"),
        (["--set", "sampling.top_p=2"], "sampling.top_p"),
        (["--set", "nosuch.field=1"], "nosuch"),
    ],
)
def test_bad_configs_fail_with_one_line_before_anything_is_written(tmp_path, capsys, argv, message):
    (tmp_path / "bad.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": 3}\n')
    out = tmp_path / "out"
    code = main(["run", "--out", str(out), "--no-progress", *[a.format(tmp=tmp_path) for a in argv]])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert not out.exists()


@pytest.mark.slow
def test_a_freshest_mode_run_replays_bit_exactly_from_its_own_log(tmp_path, cache_dir):
    from runtime.replay import replay_run

    out = str(tmp_path / "fresh")
    summary = run(tiny(cache_dir, "run.steps=3", 'scheduling.mode="freshest"', "scheduling.max_staleness=1"),
                  out, progress=False, log=lambda m: None)
    report = replay_run(out, regenerate=True)
    assert report.match and report.first_divergence is None
    assert report.versions_verified == 4 and report.final_digest == summary["final_digest"]
    assert report.rollouts_regenerated >= 3 * 16


@pytest.mark.slow
@pytest.mark.parametrize("staleness", [0, 1])
def test_resume_after_sigkills_ends_with_the_uninterrupted_digest(tmp_path, cache_dir, staleness):
    """SIGKILL during a train step, during a parameter write and during generation (failpoints,
    ``runtime.failpoints``), resuming after each: the run ends with the uninterrupted digest."""
    extra = ["run.steps=6", f"scheduling.max_staleness={staleness}"]
    reference = run(tiny(cache_dir, *extra), str(tmp_path / "ref"), progress=False, log=lambda m: None)
    out = str(tmp_path / "killed")
    first = [sys.executable, "-m", "runtime.cli", "run", "--out", out, "--no-progress"]
    for o in [*TINY, f'pretrain.cache_dir="{cache_dir}"', *extra]:
        first += ["--set", o]
    again = [sys.executable, "-m", "runtime.cli", "resume", out, "--no-progress"]
    outputs = []
    for argv, point in ((first, "trainer.step@2"), (again, "params.put@2"), (again, "inference.generate@1")):
        proc = subprocess.run(argv, env={**os.environ, "RLX_FAILPOINTS": point, "RLX_TEST_FAILPOINTS": "1"}, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == -signal.SIGKILL, (point, proc.returncode, proc.stderr[-2000:])
        outputs.append(proc.stdout)
    assert "half-written parameter version" in outputs[2]  # the resume after the killed put cleaned it
    done = subprocess.run(again, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    with open(os.path.join(out, "summary.json")) as f:
        resumed = json.load(f)
    assert resumed["final_digest"] == reference["final_digest"]
    with open_store(out) as store:
        assert store.verify("run").ok
        starts = [s.event for s in store.read("run") if s.kind == "ControllerStarted"]
    assert len(starts) == 1 + 3  # the first start and one per resume
    from runtime.audit import check_run
    from runtime.params import ParamStore

    with open_store(out) as store:
        events = list(store.read("run"))
    pstore = ParamStore.open(os.path.join(out, "params"))
    assert check_run(events, stored={v: pstore.verify(v) for v in pstore.versions()}) == []
    finished = subprocess.run(again, capture_output=True, text=True)
    assert finished.returncode == 0 and "already finished" in finished.stdout


@pytest.mark.slow
def test_a_local_hugging_face_checkpoint_and_jsonl_data(tmp_path, cache_dir):
    import jax

    from runtime.model import Model, ModelConfig, char_tokenizer, save_hf

    tok = char_tokenizer()
    mc = ModelConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                     intermediate_size=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    save_hf(str(tmp_path / "ckpt"), Model.init(mc, key=jax.random.key(5), tokenizer=tok))
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(40)]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "run"
    code = main(["run", "--out", str(out), "--no-progress", "--steps", "2", "--model", str(tmp_path / "ckpt"),
                 "--data", str(tmp_path / "data.jsonl"), *[x for o in TINY for x in ("--set", o)]])
    assert code == 0
    with open(out / "summary.json") as f:
        summary = json.load(f)
    assert summary["warm_start"]["steps"] == 0  # a given checkpoint is used as it is
    assert summary["steps"] == 2 and summary["eval_size"] == 4
    with open_store(out) as store:
        started = next(store.read("run")).event
    assert started.config["model"]["path"] == str(tmp_path / "ckpt")
    assert started.config["data"]["size"] == 36


@pytest.mark.slow
def test_a_run_on_postgresql_resumes_replays_and_audits_from_its_directory(tmp_path, cache_dir, pg_url):
    """The ledger lives in PostgreSQL: the run directory's ``ledger.json`` names it, so resume,
    replay, audit and the ledger tools work on the directory alone. The database password comes
    from the environment (libpq's PGPASSWORD; the test server trusts any) and is written nowhere."""
    out = str(tmp_path / "pg")
    secret = "s3cret-" + os.urandom(8).hex()
    env = {**os.environ, "PGPASSWORD": secret}
    first = [sys.executable, "-m", "runtime.cli", "run", "--out", out, "--no-progress"]
    for o in [*TINY, f'pretrain.cache_dir="{cache_dir}"', "run.steps=3", f'ledger.url="{pg_url}"']:
        first += ["--set", o]
    killed = subprocess.run(first, env={**env, "RLX_FAILPOINTS": "trainer.step@2", "RLX_TEST_FAILPOINTS": "1"}, capture_output=True,
                            text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not os.path.exists(os.path.join(out, "ledger.db"))
    with open(os.path.join(out, "ledger.json")) as f:
        assert json.load(f) == {"url": pg_url, "run_id": "run"}
    done = subprocess.run([sys.executable, "-m", "runtime.cli", "resume", out, "--no-progress"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert pg_url.split("?")[0] in done.stdout  # the summary names the ledger where it is
    assert "steps since the resume" in done.stdout  # its steps/min are the resume's, and it says so
    # The same run name again from another directory: no resume of a directory that is not the run's.
    again = [*first[:5], str(tmp_path / "other"), *first[6:]]
    refused = subprocess.run(again, capture_output=True, text=True, timeout=600, env=env)
    assert refused.returncode == 2 and "give this run another name (--set run.name=NAME)" in refused.stderr
    assert "rlx resume " + str(tmp_path / "other") not in refused.stderr
    assert not os.path.exists(tmp_path / "other" / "ledger.json")
    with open_store(pg_url) as store:
        assert store.runs() == ["run"] and store.verify("run").ok
        events = [s.event for s in store.read("run")]
        final = next(e for e in events if type(e) is ev.RunFinished)
        # The final version's evaluation follows RunFinished; the resume evaluated what the kill cut.
        assert sorted(e.version for e in events if type(e) is ev.VersionEvaluated) == [0, 3]
        bodies = b"".join(r.body for r in store.scan("run", 1, store.head("run").seq))
    written = [open(os.path.join(d, f), "rb").read() for d, _, fs in os.walk(out) for f in fs]
    for blob in [bodies, *written, (killed.stdout + killed.stderr + done.stdout + done.stderr).encode()]:
        assert secret.encode() not in blob
    assert main(["audit", out, "check"]) == 0
    assert main(["ledger", "verify", out]) == 0
    from runtime.replay import replay_run

    report = replay_run(out)
    assert report.match and report.final_digest == final.final_digest


@pytest.mark.slow
def test_pretrain_alone_trains_or_loads_the_warm_start_and_saves_a_checkpoint(tmp_path, cache_dir, capsys):
    argv = ["pretrain", "--steps", "20"]
    for o in [o for o in TINY if not o.startswith("pretrain.steps")] + [f'pretrain.cache_dir="{cache_dir}"']:
        argv += ["--set", o]
    out = str(tmp_path / "warm")
    assert main([*argv, "--out", out]) == 0
    printed = capsys.readouterr().out
    import jax
    import numpy as np

    from runtime.evaluation import greedy_pass_rate
    from runtime.model import load_hf
    from runtime.session import build_session

    session = build_session(tiny(cache_dir), log=lambda m: None)  # what `rlx run` would start from
    saved = load_hf(out)
    assert session.warm_start["cached"] and session.warm_start["checkpoint"] in printed.replace("\n", "")
    flat = lambda tree: np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)])  # noqa: E731
    assert flat(saved.params).tobytes() == flat(session.model.params).tobytes()
    rate = greedy_pass_rate(session.engine, session.task, session.codec, session.model.params, size=16,
                            max_tokens=session.config.max_tokens)
    assert f"held-out greedy pass rate: {rate:.1%}" in printed
    assert main([*argv, "--out", out]) == 2  # never overwrites a checkpoint
    assert "already holds a checkpoint" in capsys.readouterr().err


@pytest.mark.slow
def test_failing_snapshot_writes_are_said_once_and_the_run_finishes(tmp_path, cache_dir):
    out = str(tmp_path / "snapfail")
    argv = [sys.executable, "-m", "runtime.cli", "run", "--out", out, "--no-progress"]
    for o in [*TINY, f'pretrain.cache_dir="{cache_dir}"', "run.steps=3", "ledger.snapshot_every=8"]:
        argv += ["--set", o]
    # The 1st and 2nd snapshot writes raise an I/O error; the later ones succeed.
    proc = subprocess.run(argv, env={**os.environ, "RLX_FAILPOINTS": "ledger.snapshot@1:raise=2", "RLX_TEST_FAILPOINTS": "1"},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = " ".join(proc.stdout.split())  # the console wraps long lines
    assert said.count("not written") == 1 and said.count("failpoint ledger.snapshot (reach 1)") == 1, said
    assert said.count("are written again") == 1 and "after 2 failed writes" in said, said
    with open(os.path.join(out, "summary.json")) as f:
        assert json.load(f)["final_version"] == 3
    with open_store(out) as store:
        assert store.verify("run").ok
        assert store.snapshots("run") and store.snapshots("run")[0].seq <= store.head("run").seq


@pytest.mark.slow
def test_resume_on_another_stack_says_so(tmp_path, cache_dir, monkeypatch):
    out = str(tmp_path / "moved")
    first = [sys.executable, "-m", "runtime.cli", "run", "--out", out, "--no-progress"]
    for o in [*TINY, f'pretrain.cache_dir="{cache_dir}"', "run.steps=3"]:
        first += ["--set", o]
    killed = subprocess.run(first, env={**os.environ, "RLX_FAILPOINTS": "trainer.step@2", "RLX_TEST_FAILPOINTS": "1"}, capture_output=True,
                            text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    import runtime.run as rr
    import runtime.session as rs

    recorded = rs.fingerprint()
    monkeypatch.setattr(rs, "fingerprint", lambda: {**recorded, "cores": recorded["cores"] + 6})
    lines: list[str] = []
    summary = rr.resume(out, progress=False, log=lines.append)
    assert summary["final_version"] == 3
    warnings = [m for m in lines if m.startswith("warning:")]
    assert len(warnings) == 1 and f"cores {recorded['cores']} → {recorded['cores'] + 6}" in warnings[0]


@pytest.mark.slow
def test_more_workers_change_nothing_but_timing_in_deterministic_mode(tmp_path, cache_dir):
    base = ["run.steps=3", "workers.inference_slots=4"]  # 4 leases each: every inference worker gets work
    one = run(tiny(cache_dir, *base), str(tmp_path / "one"), progress=False, log=lambda m: None)
    many = run(tiny(cache_dir, *base, "workers.inference=2", "workers.verifiers=3"), str(tmp_path / "many"),
               progress=False, log=lambda m: None)
    assert many["final_digest"] == one["final_digest"]
    with open_store(str(tmp_path / "many")) as store:
        events = [s.event for s in store.read("run")]
    joined = sorted(e.worker_id for e in events if e.KIND == "WorkerJoined")
    assert joined == ["inference-0", "inference-1", "trainer-0", "verifier-0", "verifier-1", "verifier-2"]
    # Threads record what worker processes record: the trainer's stack and layout, each engine's shape.
    for e in events:
        if e.KIND == "WorkerJoined" and e.role in ("trainer", "inference"):
            assert e.info["fingerprint"]["devices"] >= 1 and e.info["fingerprint"]["processes"] == 1, e
        if e.KIND == "WorkerJoined" and e.role == "inference":
            assert e.info["engine"]["attention_impl"] == "live", e  # the resolved config's, as in processes
    assert {e.worker_id for e in events if e.KIND == "RolloutCompleted"} == {"inference-0", "inference-1"}


def test_each_run_without_out_gets_a_directory_of_its_own(tmp_path):
    from runtime.commands.run import default_out

    runs = str(tmp_path / "runs")
    assert default_out(None, runs) == os.path.join(runs, "demo")
    os.makedirs(os.path.join(runs, "demo"))
    os.makedirs(os.path.join(runs, "demo-2"))
    assert default_out(None, runs) == os.path.join(runs, "demo-3")
    assert default_out("configs/smollm2-chain-sum.toml", runs) == os.path.join(runs, "smollm2-chain-sum")


@pytest.mark.slow
def test_two_runs_without_out_one_after_the_other(tmp_path, cache_dir):
    """What the README's examples do after the demo: ``rlx run`` twice without ``--out`` in one
    directory; the second gets ``runs/demo-2`` instead of being refused for ``runs/demo``."""
    argv = [sys.executable, "-m", "runtime.cli", "run", "--no-progress", "--steps", "1"]
    for o in [*TINY, f'pretrain.cache_dir="{cache_dir}"', "eval.every_steps=0"]:
        argv += ["--set", o]
    outputs = []
    for _ in range(2):
        proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
        assert proc.returncode == 0, proc.stderr[-2000:]
        outputs.append(proc.stdout)
    assert "run directory: runs/demo (--out names another)" in outputs[0]
    assert "run directory: runs/demo-2" in outputs[1]
    for name in ("demo", "demo-2"):
        with open(tmp_path / "runs" / name / "summary.json") as f:
            summary = json.load(f)
        assert summary["steps"] == 1 and summary["machine"].endswith(f"{len(os.sched_getaffinity(0))} cores")
    assert "machine" in outputs[1]  # the table names the CPU that decides the last bits
    assert "runs/demo (run 'run')" in outputs[0] and "run run" not in outputs[0]  # its title
