"""Checkpoints as the installed Transformers saves them, chat template in ``chat_template.jinja``.

For each supported architecture a tiny model and a tokenizer with a chat template go through
Transformers' own ``save_pretrained``; rlx must read the template where Transformers does
(``chat_template.jinja``, then ``chat_template.json``, then ``tokenizer_config.json``), render every
row's prompt to ``apply_chat_template(..., add_generation_prompt=True)``'s ids, record which file
the template came from, and export a version that Transformers loads with the same template and
logits. A template file that is not UTF-8, empty or too large is a one-line error.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil

import numpy as np
import pytest

from runtime.config import CHAT_TEMPLATE_FILES, load_config
from runtime.errors import UsageError
from runtime.model.hf_text import TEMPLATE_FILES
from runtime.session import build_codec, make_task, resolve
from tests.runtime.model.tiny_checkpoint import CHAT_TEMPLATE, END_OF_TEXT, IM_END, bpe_tokenizer

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

ROWS = [{"prompt": f"What is {a} plus {b}?", "answer": str(a + b)} for a in range(4) for b in range(5)]
ROWS.append({"messages": [{"role": "system", "content": "Answer with a number."},
                          {"role": "user", "content": "What is 7 plus 8?"}], "answer": "15"})
SHAPE = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
             intermediate_size=64, max_position_embeddings=256)
CONFIGS = {
    "llama": lambda vocab, ids: transformers.LlamaConfig(vocab_size=vocab, **SHAPE, **ids),
    "mistral": lambda vocab, ids: transformers.MistralConfig(vocab_size=vocab, **SHAPE, **ids, sliding_window=None),
    "qwen2": lambda vocab, ids: transformers.Qwen2Config(vocab_size=vocab, **SHAPE, **ids),
    "qwen3": lambda vocab, ids: transformers.Qwen3Config(vocab_size=vocab, **SHAPE, **ids, head_dim=16),
}


def _texts():
    return [r.get("prompt") or r["messages"][-1]["content"] for r in ROWS] + [r["answer"] for r in ROWS]


def save_with_transformers(directory, architecture: str, *, tie: bool = True, dtype=None, shard: str | None = None):
    """A tiny random ``architecture`` model and its tokenizer, written by ``save_pretrained`` (weights in
    ``dtype``, split into shards of at most ``shard``); returns the model."""
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe_tokenizer(_texts()), eos_token=IM_END, pad_token=END_OF_TEXT,
        bos_token=None if architecture.startswith("qwen") else END_OF_TEXT)
    tok.chat_template = CHAT_TEMPLATE
    ids = dict(bos_token_id=tok.convert_tokens_to_ids(END_OF_TEXT), eos_token_id=tok.convert_tokens_to_ids(IM_END),
               pad_token_id=tok.convert_tokens_to_ids(END_OF_TEXT), tie_word_embeddings=tie)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[architecture](len(tok), ids))
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(directory, **({"max_shard_size": shard} if shard else {}))
    tok.save_pretrained(directory)
    return model


def _config(directory, data, *overrides):
    return load_config(None, [f'model.path="{directory}"', f'data.path="{data}"', 'data.task="jsonl"',
                              "data.chat_template=true", *overrides])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "sums.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def _assert_prompts_are_transformers(directory, data):
    hf = transformers.AutoTokenizer.from_pretrained(str(directory))
    config = _config(directory, data)
    codec, task = build_codec(config), make_task(config)
    problems = [task.problem("train", i) for i in range(task.train_size)]
    problems += [task.problem("eval", i) for i in range(task.eval_size)]
    assert len(problems) == len(ROWS)
    for p in problems:
        messages = [{"role": r, "content": c} for r, c in p.messages] or [{"role": "user", "content": p.prompt}]
        expected = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert codec.encode_prompt(p).tolist() == list(expected), p
    return config, codec, task


# Tied and untied embeddings, float32 and bfloat16 weights on disk, one file and shards with an index.
LAYOUTS = {"llama": dict(shard="40KB"), "mistral": dict(tie=False), "qwen2": dict(dtype="bfloat16"),
           "qwen3": dict(tie=False, dtype="bfloat16", shard="40KB")}


@pytest.mark.parametrize("architecture", sorted(CONFIGS))
def test_a_checkpoint_saved_by_transformers_renders_its_prompts_as_transformers_does(architecture, tmp_path, data):
    from runtime.model import forward, load_hf

    layout = dict(LAYOUTS[architecture])
    if "dtype" in layout:
        layout["dtype"] = getattr(torch, layout["dtype"])
    model = save_with_transformers(tmp_path, architecture, **layout)
    assert (tmp_path / "chat_template.jinja").read_text() == CHAT_TEMPLATE
    assert (tmp_path / "model.safetensors.index.json").exists() == ("shard" in layout)
    ours = load_hf(str(tmp_path), dtype="float32")
    ids = list(range(3, 40))
    want = np.asarray(forward(ours.params, np.asarray([ids], np.int32), config=ours.config))[0]
    with torch.no_grad():
        got = model.float()(torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(want, got, atol=1e-4)
    assert "chat_template" not in json.loads((tmp_path / "tokenizer_config.json").read_text())
    config, codec, task = _assert_prompts_are_transformers(tmp_path, data)
    resolved = resolve(config, task)
    assert resolved.data.chat_template_file == "chat_template.jinja"
    assert resolved.data.chat_template_digest == hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest()
    # The older layout: the template only in tokenizer_config.json.
    older = tmp_path / "older"
    shutil.copytree(tmp_path, older, ignore=shutil.ignore_patterns("older"))
    (older / "chat_template.jinja").unlink()
    tok_config = json.loads((older / "tokenizer_config.json").read_text())
    (older / "tokenizer_config.json").write_text(json.dumps({**tok_config, "chat_template": CHAT_TEMPLATE}))
    config, _, task = _assert_prompts_are_transformers(older, data)
    assert resolve(config, task).data.chat_template_file == "tokenizer_config.json"


def test_the_template_files_are_read_in_transformers_order(tmp_path, data):
    assert TEMPLATE_FILES == CHAT_TEMPLATE_FILES
    save_with_transformers(tmp_path, "qwen2")
    tok_config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**tok_config, "chat_template": "{{ 'config' }}"}))
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": "{{ 'json' }}"}))
    files = []
    for _ in range(3):
        codec = build_codec(_config(tmp_path, data))
        files.append((codec.template_file, codec.template.source))
        (tmp_path / codec.template_file).unlink() if codec.template_file != "tokenizer_config.json" else None
    assert files == [("chat_template.jinja", CHAT_TEMPLATE), ("chat_template.json", "{{ 'json' }}"),
                     ("tokenizer_config.json", "{{ 'config' }}")]
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert hf.chat_template == "{{ 'config' }}"


@pytest.mark.parametrize("content, says", [
    (b"\xff\xfe{{ 'x' }}", "is not UTF-8 text (byte 0)"),
    (b"  \n", "chat_template is empty"),
    (b"x" * (4 << 20) + b"x", "is larger than"),
    ("é".encode() * ((1 << 20) + 1), "characters; at most"),
])
def test_a_bad_template_file_is_one_line_and_nothing_is_written(tmp_path, data, content, says):
    from runtime.run import run

    save_with_transformers(tmp_path / "ckpt", "qwen2")
    (tmp_path / "ckpt" / "chat_template.jinja").write_bytes(content)
    with pytest.raises(UsageError) as e:
        build_codec(_config(tmp_path / "ckpt", data))
    assert says in str(e.value) and "chat_template.jinja" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UsageError, match=re.escape(says)):
        run(_config(tmp_path / "ckpt", data, "workers.mode=threads"), out=str(tmp_path / "run"), progress=False,
            log=lambda *_: None)
    assert not (tmp_path / "run" / "ledger.db").exists() and not (tmp_path / "run" / "params").exists()


def test_a_recorded_template_that_changed_names_its_file(tmp_path, data):
    save_with_transformers(tmp_path, "qwen2")
    recorded = hashlib.sha256(b"another template").hexdigest()
    with pytest.raises(UsageError) as e:
        build_codec(_config(tmp_path, data, f'data.chat_template_digest="{recorded}"',
                            'data.chat_template_file="chat_template.jinja"'))
    assert "from chat_template.jinja" in str(e.value) and "restore the checkpoint's chat_template.jinja" in str(e.value)
    with pytest.raises(UsageError, match="data.chat_template_file"):
        load_config(None, ['data.chat_template_file="other.jinja"', "data.chat_template=true"])


@pytest.mark.slow
@pytest.mark.parametrize("architecture", sorted(CONFIGS))
def test_a_run_on_a_saved_checkpoint_exports_what_transformers_loads_with_the_same_template(architecture, tmp_path,
                                                                                            data):
    from runtime.export import export_version
    from runtime.run import run

    source = tmp_path / "saved"
    save_with_transformers(source, architecture, tie=architecture != "mistral")
    config = _config(source, data, "run.steps=1", "sampling.group_size=2", "scheduling.groups_per_batch=2",
                     "sampling.max_tokens=4", "eval.every_steps=0", "workers.mode=threads")
    run(config, out=str(tmp_path / "run"), progress=False, log=lambda *_: None)
    out = tmp_path / "exported"
    export_version(str(tmp_path / "run"), 1, out)
    assert (out / "chat_template.jinja").read_bytes() == (source / "chat_template.jinja").read_bytes()
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE  # older readers
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert hf_tok.chat_template == CHAT_TEMPLATE
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), torch_dtype=torch.float32)
    ids = hf_tok.apply_chat_template([{"role": "user", "content": "What is 1 plus 2?"}], add_generation_prompt=True,
                                     tokenize=True, return_dict=False)
    from runtime.model import forward, load_hf

    ours = load_hf(str(out))
    want = np.asarray(forward(ours.params, np.asarray([ids], np.int32), config=ours.config))[0]
    with torch.no_grad():
        got = model(torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)
