"""``rlx export`` of a run started from a checkpoint copies only the checkpoint's own files: a file
that is a link (``merges.txt -> ~/secret``) or an index's shard name that leaves the directory is
refused in one line, nothing is written at ``--out``, and every file the export writes keeps its
source's permission bits."""

from __future__ import annotations

import json
import os
import shutil
import stat

import pytest

from runtime.cli import main
from runtime.errors import UsageError
from runtime.export import export_version
from tests.runtime import small_run
from tests.runtime.model.tiny_checkpoint import write_checkpoint

SECRET = "the contents of a file the export must never copy\n"


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    """(run directory, its checkpoint, a pristine copy of the checkpoint) of a one-step run."""
    root = tmp_path_factory.mktemp("export_hardening")
    small_run.write_sums(root / "sums.jsonl")
    texts = [f"{a}+{b}={a + b}" for a in range(5) for b in range(5)]
    write_checkpoint(root / "ckpt", texts, chat_template=False)
    (root / "ckpt" / "merges.txt").write_text("#version: 0.2\n")
    (root / "ckpt" / "added_tokens.json").write_text("{}\n")
    shutil.copytree(root / "ckpt", root / "pristine")
    overrides = ['workers.mode="threads"', *small_run.TINY, "sampling.max_tokens=4"]
    code = main(["run", "--out", str(root / "run"), "--no-progress", "--steps", "1", "--model", str(root / "ckpt"),
                 "--data", str(root / "sums.jsonl"), *[x for o in overrides for x in ("--set", o)]])
    assert code == 0
    return root / "run", root / "ckpt", root / "pristine"


@pytest.fixture
def run(started, tmp_path):
    """The run with its checkpoint as it was written, and a secret file outside it."""
    run_dir, ckpt, pristine = started
    shutil.rmtree(ckpt)
    shutil.copytree(pristine, ckpt)
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    return run_dir, ckpt, secret


@pytest.mark.parametrize("name", ["merges.txt", "added_tokens.json", "tokenizer_config.json", "generation_config.json"])
def test_a_checkpoint_file_that_is_a_link_is_not_exported(run, tmp_path, name):
    run_dir, ckpt, secret = run
    (ckpt / name).unlink()
    os.symlink(secret, ckpt / name)
    out = tmp_path / "out"
    with pytest.raises(UsageError) as e:
        export_version(str(run_dir), 1, out)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(f"{ckpt / name} is a symbolic link (to {str(secret)!r}); rlx reads only a "
                                   "checkpoint's own regular files")
    assert not out.exists() and not list(tmp_path.glob(".out.*"))  # nothing written, no staging left


@pytest.mark.parametrize("kind", ["absolute", "parent"])
def test_an_index_naming_a_shard_outside_the_checkpoint_is_not_exported(run, tmp_path, kind):
    run_dir, ckpt, _ = run
    outside = tmp_path / "elsewhere.safetensors"
    shutil.move(ckpt / "model.safetensors", outside)
    shard = str(outside) if kind == "absolute" else "../elsewhere.safetensors"
    if kind == "parent":
        shutil.move(outside, ckpt.parent / "elsewhere.safetensors")
    from safetensors import safe_open

    with safe_open(str(ckpt.parent / "elsewhere.safetensors" if kind == "parent" else outside), "numpy") as f:
        weight_map = dict.fromkeys(f.keys(), shard)
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(UsageError, match=f"model.safetensors.index.json weight_map names the file {shard!r}; "
                                         "accepted: plain names of files in the checkpoint directory"):
        export_version(str(run_dir), 1, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_every_exported_file_keeps_its_sources_mode(run, tmp_path):
    run_dir, ckpt, _ = run
    modes = {"added_tokens.json": 0o600, "merges.txt": 0o640, "tokenizer.json": 0o644, "config.json": 0o600,
             "model.safetensors": 0o640, "tokenizer_config.json": 0o400}
    for name, mode in modes.items():
        (ckpt / name).chmod(mode)
    out = tmp_path / "out"
    done = export_version(str(run_dir), 1, out)
    assert {"added_tokens.json", "merges.txt", "model.safetensors", "config.json"} <= set(done.files)
    assert {name: stat.S_IMODE((out / name).stat().st_mode) for name in modes} == modes
    assert (out / "merges.txt").read_text() == "#version: 0.2\n"
    assert (out / "tokenizer_config.json").read_bytes() == (ckpt / "tokenizer_config.json").read_bytes()
