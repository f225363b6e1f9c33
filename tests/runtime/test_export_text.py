"""``runtime.export_text``: an exported tokenizer starts a prompt in Transformers as rlx does.

Checkpoint directories of text files only (a ``config.json`` and the tokenizer files), read by
rlx's own ``checkpoint_text`` and by Transformers' ``AutoTokenizer``.
"""

from __future__ import annotations

import json
import shutil

import pytest
from tokenizers import processors

transformers = pytest.importorskip("transformers")

from runtime.export_text import added_prefix, aligned_text_files  # noqa: E402
from runtime.known_models import imported, known_model, models_dir  # noqa: E402
from runtime.model import BOS_ID, char_tokenizer  # noqa: E402
from runtime.model.hf import tokenizer_config  # noqa: E402
from runtime.model.hf_text import checkpoint_text  # noqa: E402
from runtime.tasks.base import Problem, TextCodec  # noqa: E402

PROMPT = "12+3="


def _checkpoint(path, arch: str, tokenizer, **tok_config):
    path.mkdir()
    hf_config = {"model_type": arch, "vocab_size": tokenizer.get_vocab_size(), "bos_token_id": 1, "eos_token_id": 2,
                 "pad_token_id": 0}
    (path / "config.json").write_text(json.dumps(hf_config))
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config(tokenizer), **tok_config}))
    return hf_config


def _exported(source, target, hf_config):
    """``target``: ``source`` with the files ``aligned_text_files`` rewrites; returns them."""
    text = checkpoint_text(source, hf_config)
    files = aligned_text_files(text.tokenizer, json.loads((source / "tokenizer_config.json").read_text()),
                               text.bos_id)
    shutil.copytree(source, target)
    for name, content in files.items():
        (target / name).write_text(content)
    return files


def _rlx_ids(directory, hf_config) -> list[int]:
    return TextCodec.for_checkpoint(checkpoint_text(directory, hf_config)).encode_prompt(Problem(PROMPT)).tolist()


def _transformers_ids(directory) -> list[int]:
    return transformers.AutoTokenizer.from_pretrained(directory)(PROMPT)["input_ids"]


def test_a_llama_tokenizer_that_adds_no_bos_gets_the_bos_rlx_prompts_with(tmp_path):
    # rlx starts a llama checkpoint's prompts with BOS (no add_bos_token says otherwise); the
    # character tokenizer's own files add nothing.
    hf_config = _checkpoint(tmp_path / "src", "llama", char_tokenizer())
    plain = char_tokenizer().encode(PROMPT).ids
    assert _rlx_ids(tmp_path / "src", hf_config) == [BOS_ID, *plain]
    assert _transformers_ids(tmp_path / "src") == plain
    files = _exported(tmp_path / "src", tmp_path / "out", hf_config)
    assert sorted(files) == ["tokenizer.json", "tokenizer_config.json"]
    assert json.loads(files["tokenizer_config.json"])["add_bos_token"] is True
    assert _transformers_ids(tmp_path / "out") == _rlx_ids(tmp_path / "out", hf_config) == [BOS_ID, *plain]


def test_a_tokenizer_that_adds_a_bos_rlx_does_not_use_loses_it(tmp_path):
    tokenizer = char_tokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", BOS_ID)])
    hf_config = _checkpoint(tmp_path / "src", "qwen3", tokenizer)  # qwen3: rlx prepends nothing
    plain = char_tokenizer().encode(PROMPT).ids
    assert _rlx_ids(tmp_path / "src", hf_config) == plain
    assert _transformers_ids(tmp_path / "src") == [BOS_ID, *plain]
    _exported(tmp_path / "src", tmp_path / "out", hf_config)
    assert _transformers_ids(tmp_path / "out") == _rlx_ids(tmp_path / "out", hf_config) == plain


@pytest.mark.parametrize(("arch", "tok_config"), [("qwen3", {}), ("llama", {"add_bos_token": False})])
def test_files_that_already_agree_are_left_as_they_are(tmp_path, arch, tok_config):
    hf_config = _checkpoint(tmp_path / "src", arch, char_tokenizer(), **tok_config)
    assert _exported(tmp_path / "src", tmp_path / "out", hf_config) == {}
    assert _transformers_ids(tmp_path / "out") == _rlx_ids(tmp_path / "out", hf_config) == char_tokenizer().encode(
        PROMPT).ids


def test_smollm2_adds_no_bos_in_either(tmp_path):
    known = known_model("smollm2")
    path = models_dir() / known.directory
    if not imported(known, path):
        pytest.skip("SmolLM2 is not imported (scripts/get_model smollm2)")
    hf_config = json.loads((path / "config.json").read_text())
    text = checkpoint_text(path, hf_config)
    assert text.bos_id is None and added_prefix(text.tokenizer) == []
    tok_config = json.loads((path / "tokenizer_config.json").read_text())
    assert aligned_text_files(text.tokenizer, tok_config, text.bos_id) == {}
    assert _transformers_ids(path) == _rlx_ids(path, hf_config) == text.tokenizer.encode(PROMPT).ids
