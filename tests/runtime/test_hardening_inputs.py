"""A run's input files are content-addressed: ``RunStarted`` records the data file by absolute
path and sha256 (the config as typed, and its digest, unchanged); ``rlx resume`` reads it from
there whatever the working directory, and ``rlx resume`` and ``rlx replay`` refuse, in one line
naming the file, a data file that changed since."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys

import pytest

from ledger import open_store
from runtime import inputs
from runtime.cli import main
from runtime.config import Config
from runtime.errors import UsageError
from tests.runtime import small_run

TINY = ['workers.mode="threads"', *small_run.TINY, "run.steps=3"]


def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """A run on ``data.jsonl`` named relative to its working directory, killed in step 2."""
    root = tmp_path_factory.mktemp("inputs")
    here = root / "here"
    here.mkdir()
    small_run.write_sums(here / "data.jsonl")
    out = str(root / "run")
    argv = [sys.executable, "-m", "runtime.cli", "run", "--out", out, "--no-progress", "--data", "data.jsonl",
            "--set", f'pretrain.cache_dir="{root / "warm"}"']
    for o in TINY:
        argv += ["--set", o]
    proc = subprocess.run(argv, cwd=here, env={**os.environ, "RLX_FAILPOINTS": "trainer.step@2",
                                               "RLX_TEST_FAILPOINTS": "1", "PYTHONPATH": os.getcwd()},
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    return root, out, str(here / "data.jsonl")


@pytest.mark.slow
def test_inputs_are_recorded_by_absolute_path_and_digest_and_checked_on_resume_and_replay(
        killed, monkeypatch, capsys):
    root, out, data = killed
    with open_store(out, readonly=True) as store:
        started = next(store.read("run")).event
    assert started.config["data"]["path"] == "data.jsonl"  # the config as typed: its digest is unchanged
    assert started.config_digest == Config.from_dict(started.config).digest()
    assert started.fingerprint["inputs"] == {"data": {"path": data, "files": {"data.jsonl": _sha(data)}}}
    honest = open(data, "rb").read()

    elsewhere = root / "elsewhere"  # another working directory, with another data.jsonl in it
    elsewhere.mkdir()
    (elsewhere / "data.jsonl").write_text('{"prompt": "9+9=", "answer": "18"}\n' * 30)
    monkeypatch.chdir(elsewhere)

    with open(data, "ab") as f:  # the run's data file edited after it started
        f.write(b'{"prompt": "1+1=", "answer": "3"}\n')
    edited = _sha(data)
    assert main(["resume", out, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"rlx: error: cannot resume: input file {data!r} has changed since the run read it (sha256 {edited}, "
                   f"the run recorded {hashlib.sha256(honest).hexdigest()}); restore it to resume"]
    with open_store(out, readonly=True) as store:  # refused before anything was written
        assert [s.kind for s in store.read("run")].count("ControllerStarted") == 1

    with open(data, "wb") as f:
        f.write(honest)
    assert main(["resume", out, "--no-progress"]) == 0  # from elsewhere: the recorded file, not ./data.jsonl
    capsys.readouterr()
    with open_store(out, readonly=True) as store:
        events = [s.event for s in store.read("run")]
    assert any(e.KIND == "RunFinished" and e.final_version == 3 for e in events)

    from runtime.replay import replay_run

    assert replay_run(out).match
    with open(data, "ab") as f:
        f.write(b"\n")
    with pytest.raises(UsageError, match=f"cannot replay: input file {data!r} has changed since the run read it"):
        replay_run(out)
    os.remove(data)
    with pytest.raises(UsageError, match=f"cannot replay: input file {data!r} is missing \\(the run read it with sha256 {hashlib.sha256(honest).hexdigest()}\\)"):
        replay_run(out)
    with open(data, "wb") as f:
        f.write(honest)


def test_a_ledger_without_recorded_inputs_is_warned_about_not_refused(tmp_path):
    small_run.write_sums(tmp_path / "d.jsonl")
    config = Config.from_dict({"data": {"task": "jsonl", "path": str(tmp_path / "d.jsonl")}})
    lines: list[str] = []
    now = inputs.check(config, {"jax": "x"}, what="resume", warn=lines.append)
    assert now["data"]["files"] == {"d.jsonl": _sha(tmp_path / "d.jsonl")}
    assert lines == ["warning: this run's ledger predates recorded input digests: the resume cannot check that "
                     "data are the files the run read"]


def test_a_checkpoint_is_recorded_file_by_file_and_a_changed_one_is_named(tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for name, text in (("config.json", "{}"), ("model.safetensors", "weights"), ("tokenizer.json", "{}"),
                       ("tokenizer_config.json", '{"chat_template": "x"}'), ("README.md", "not read")):
        (ckpt / name).write_text(text)
    config = Config.from_dict({"model": {"path": "ckpt"}})
    monkeypatch.chdir(tmp_path)
    recorded = inputs.record(config)
    assert recorded == {"model": {"path": str(ckpt), "files": {
        n: _sha(ckpt / n) for n in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")}}}
    fingerprint = {"inputs": recorded}
    assert inputs.located(config, fingerprint).model.path == str(ckpt)
    assert inputs.check(inputs.located(config, fingerprint), fingerprint, what="replay", warn=print) == recorded
    (ckpt / "tokenizer_config.json").write_text('{"chat_template": "y"}')
    with pytest.raises(UsageError, match=r"cannot replay: input file '.*/ckpt/tokenizer_config.json' has changed"):
        inputs.check(config, fingerprint, what="replay", warn=print)
