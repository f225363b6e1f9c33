"""``rlx run`` refuses what it could not record, before anything is built or written: one line,
exit 2, nothing created or changed."""

from __future__ import annotations

import os

import pytest

from runtime.cli import main

FAST = ["--set", "pretrain.steps=0", "--set", "model.hidden_size=16", "--set", "model.num_layers=1",
        "--set", "model.num_heads=1", "--set", "model.num_kv_heads=1", "--set", "model.intermediate_size=16"]


def listing(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, ds, fs in os.walk(root) for f in [*fs, *ds])


def refused(capsys, tmp_path, argv: list[str], message: str) -> None:
    before = listing(tmp_path)
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert listing(tmp_path) == before


def test_config_files_that_are_not_toml_text(capsys, tmp_path):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "latin1.toml").write_bytes(b"[run]\nname = \"caf\xe9\"\n")
    (tmp_path / "big.toml").write_bytes(b"#" * (2 << 20))
    out = str(tmp_path / "out")
    refused(capsys, tmp_path, ["run", str(tmp_path / "cfg"), "--out", out], "is a directory; give a TOML file")
    refused(capsys, tmp_path, ["run", str(tmp_path / "latin1.toml"), "--out", out], "is not UTF-8 text (byte 17)")
    refused(capsys, tmp_path, ["run", str(tmp_path / "big.toml"), "--out", out], "is larger than 1024 KiB")
    refused(capsys, tmp_path, ["run", "/dev/zero", "--out", out], "is larger than 1024 KiB")


def test_an_output_directory_that_cannot_be(capsys, tmp_path):
    (tmp_path / "file").write_text("x")
    refused(capsys, tmp_path, ["run", "--out", str(tmp_path / "file" / "run"), *FAST],
            "cannot be created: " + repr(str(tmp_path / "file")) + " is not a directory")
    refused(capsys, tmp_path, ["run", "--out", str(tmp_path / "file"), *FAST], "exists and is not a directory")
    refused(capsys, tmp_path, ["pretrain", "--out", str(tmp_path / "file" / "ckpt"), *FAST, "--steps", "1"],
            "is not a directory")


def test_a_ledger_path_that_is_a_directory_is_refused_before_training(capsys, tmp_path):
    (tmp_path / "run" / "ledger.db").mkdir(parents=True)
    refused(capsys, tmp_path, ["run", "--out", str(tmp_path / "run"), *FAST], "is a directory; give a ledger file")


@pytest.mark.postgres
def test_an_unreachable_ledger_server_is_found_before_the_run_directory_is_made(capsys, tmp_path):
    refused(capsys, tmp_path, ["run", "--out", str(tmp_path / "run"), "--set",
                               'ledger.url="postgresql://postgres@127.0.0.1:1/test"', *FAST], "127.0.0.1:1")


@pytest.mark.slow
def test_completions_longer_than_the_model_can_hold(capsys, tmp_path):
    out = str(tmp_path / "run")
    refused(capsys, tmp_path, ["run", "--out", out, "--set", "sampling.max_tokens=1000000000", *FAST],
            "sampling.max_tokens: 1000000000 is not accepted; it must be <= 65536")
    refused(capsys, tmp_path, ["run", "--out", out, "--set", "sampling.max_tokens=60000", *FAST],
            "sampling.max_tokens 60000 is too large for this model")


@pytest.mark.slow
def test_a_code_task_refuses_the_weak_sandbox_unless_named(tmp_path):
    """Where namespaces are unavailable (forced here with the sandbox's own switch), ``auto`` does
    not fall back silently to ``rlimits``: the run stops before training, in one line."""
    import subprocess
    import sys

    out = tmp_path / "run"
    argv = [sys.executable, "-m", "runtime.cli", "run", "--out", str(out), "--no-progress",
            "--set", 'data.task="codefn"', *FAST]
    env = {**os.environ, "RLX_SANDBOX_NO_NAMESPACES": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "rlimits" in done.stderr and not out.exists()


def test_a_sliding_window_shorter_than_the_sequences(capsys, tmp_path):
    """Attention is full causal attention, the same as a sliding window only up to its length."""
    import jax

    from runtime.model import Model, ModelConfig, char_tokenizer, save_hf

    tok = char_tokenizer()
    mc = ModelConfig(vocab_size=tok.get_vocab_size(), hidden_size=16, num_layers=1, num_heads=1, num_kv_heads=1,
                     intermediate_size=16, architecture="mistral", sliding_window=8, bos_token_id=1, eos_token_id=2,
                     pad_token_id=0)
    save_hf(str(tmp_path / "ckpt"), Model.init(mc, key=jax.random.key(0), tokenizer=tok))
    refused(capsys, tmp_path, ["run", "--out", str(tmp_path / "run"), "--model", str(tmp_path / "ckpt"), *FAST],
            "exceed the model's sliding_window=8; sliding-window attention is not supported")
