"""Prompt and completion text rebuilt from a run's logged config (no weights loaded)."""

from __future__ import annotations

from runtime.audit.text import RunText
from runtime.config import load_config
from runtime.model import EOS_ID, char_tokenizer
from runtime.session import make_task


def test_text_of_the_builtin_task_and_tokenizer():
    config = load_config(None, ["run.seed=3"])
    text = RunText(config.to_dict())
    task = make_task(config)
    assert [text.prompt(i) for i in (0, 5, 99)] == [task.problem("train", i).prompt for i in (0, 5, 99)]
    ids = char_tokenizer().encode("123", add_special_tokens=False).ids
    assert text.completion([*ids, EOS_ID, *ids]) == "123"  # up to the first end of sequence


def test_parts_that_cannot_be_rebuilt_are_none(tmp_path):
    gone = load_config(None, ["data.task=jsonl", f"data.path={tmp_path / 'gone.jsonl'}"]).to_dict()
    text = RunText(gone)
    assert text.prompt(0) is None and text.completion([EOS_ID]) == ""
    gone["model"]["path"] = str(tmp_path / "no-checkpoint")
    assert RunText(gone).completion([5, 6]) is None
    assert RunText({"run": {"steps": "many"}}).prompt(0) is None  # not a config this software reads
