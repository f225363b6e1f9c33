"""A checkpoint's tokenizer, special tokens and chat template, on a tiny Qwen2 checkpoint with a
byte-level BPE tokenizer trained on the task's text (``tiny_checkpoint``)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
import pytest

from runtime.config import load_config
from runtime.errors import UsageError
from runtime.model.chat_template import ChatTemplate, TemplateError, select_template
from runtime.model.hf_text import checkpoint_text
from runtime.session import build_codec, longest_prompt, make_task
from runtime.tasks.base import Problem, TextCodec
from tests.runtime.model.tiny_checkpoint import CHAT_TEMPLATE, END_OF_TEXT, IM_END, write_checkpoint

ROWS: list[dict[str, Any]] = [{"prompt": f"What is {a} plus {b}?", "answer": str(a + b)} for a in range(6) for b in range(6)]
ROWS.append({"messages": [{"role": "system", "content": "Answer with a number."},
                          {"role": "user", "content": "What is 7 plus 8?"}], "answer": "15"})


def _texts():
    return [r.get("prompt") or r["messages"][-1]["content"] for r in ROWS] + [r["answer"] for r in ROWS]


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    directory = tmp_path_factory.mktemp("qwen2")
    write_checkpoint(directory, _texts())
    return directory


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "sums.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def _hf_config(directory) -> dict:
    return json.loads((directory / "config.json").read_text())


def _config(qwen2, data, *overrides):
    return load_config(None, [f'model.path="{qwen2}"', f'data.path="{data}"', 'data.task="jsonl"', *overrides])


def test_qwen2_adds_no_bos_and_every_eos_id_ends_a_completion(qwen2):
    text = checkpoint_text(qwen2, _hf_config(qwen2))
    tok = text.tokenizer
    end_of_text, im_end = tok.token_to_id(END_OF_TEXT), tok.token_to_id(IM_END)
    assert _hf_config(qwen2)["bos_token_id"] == end_of_text  # named in config.json, never added
    assert text.bos_id is None
    assert text.eos_ids == (im_end, end_of_text)  # config.json's first: it ends a supervised target
    assert text.pad_id == end_of_text and text.chat_template is None
    codec = TextCodec.for_checkpoint(text)
    p = Problem(prompt="What is 3 plus 4?", answer="7", target="7")
    assert codec.encode_prompt(p).tolist() == tok.encode(p.prompt, add_special_tokens=False).ids
    assert codec.target_ids(p) == [*tok.encode("7").ids, im_end]
    seven = tok.encode("7").ids
    assert codec.decode([*seven, im_end, *seven]) == "7" and codec.decode([*seven, end_of_text, *seven]) == "7"
    assert not codec.char_level


def test_llama_adds_bos_unless_its_tokenizer_config_says_not(tmp_path):
    write_checkpoint(tmp_path, _texts(), architecture="llama")
    text = checkpoint_text(tmp_path, _hf_config(tmp_path))
    bos = text.tokenizer.token_to_id(END_OF_TEXT)
    assert text.bos_id == bos
    ids = TextCodec.for_checkpoint(text).encode_prompt(Problem(prompt="What is 3 plus 4?"))
    assert ids[0] == bos and ids[1:].tolist() == text.tokenizer.encode("What is 3 plus 4?").ids
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "add_bos_token": False}))
    assert checkpoint_text(tmp_path, _hf_config(tmp_path)).bos_id is None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "bos_token": None}))
    hf = {**_hf_config(tmp_path), "bos_token_id": None}
    with pytest.raises(UsageError, match="starts prompts with a BOS token, but neither"):
        checkpoint_text(tmp_path, hf)


def test_special_ids_out_of_range_or_missing_are_named(qwen2, tmp_path):
    hf = _hf_config(qwen2)
    with pytest.raises(UsageError, match=r"config.json eos_token_id: token ids \[100000\] are not in"):
        checkpoint_text(qwen2, {**hf, "eos_token_id": 100000})
    with pytest.raises(UsageError, match="must be a token id or a list of token ids"):
        checkpoint_text(qwen2, {**hf, "eos_token_id": "eos"})
    import shutil

    shutil.copytree(qwen2, tmp_path / "bare")
    (tmp_path / "bare" / "generation_config.json").unlink()
    (tmp_path / "bare" / "tokenizer_config.json").write_text("{}")
    with pytest.raises(UsageError, match="names no end-of-sequence token"):
        checkpoint_text(tmp_path / "bare", {**hf, "eos_token_id": None})
    bare = checkpoint_text(tmp_path / "bare", hf)
    assert bare.eos_ids == (hf["eos_token_id"],) and bare.pad_id == hf["eos_token_id"]  # the safe fallback


def test_both_eos_ids_stop_generation(qwen2):
    """Weights set by hand so that greedy decoding follows a known chain: the last prompt token
    picks the first generated token. With every layer's output projections zero the residual is
    the token's embedding, a one-hot in the first three dimensions; the final norm keeps those
    three, and the head maps dimension k to candidate k: 'a' (then end-of-turn) or end-of-text."""
    from runtime.inference import Engine, SamplingParams
    from runtime.model import load_hf

    model = load_hf(qwen2)
    codec = build_codec(load_config(None, [f'model.path="{qwen2}"']))
    tok = codec.tokenizer
    im_end, end_of_text = codec.eos_ids
    a = tok.token_to_id("a")
    first, second = (codec.encode_prompt(Problem(prompt=t)) for t in ("What is 3 plus 4?", "What is 1 plus 2"))
    assert len({a, int(first[-1]), int(second[-1])}) == 3
    p = {k: v for k, v in model.params.items()}
    H, V = model.config.hidden_size, model.config.vocab_size
    embed = np.zeros((V, H), np.float32)
    embed[:, 0] = 1.0  # any token -> 'a'
    embed[a] = np.eye(H)[1]  # 'a' -> end-of-turn
    embed[int(second[-1])] = np.eye(H)[2]  # the second prompt -> end-of-text
    head = np.zeros((H, V), np.float32)
    head[0, a], head[1, im_end], head[2, end_of_text] = 10.0, 10.0, 10.0
    p["embed_tokens"] = {"embedding": embed}
    p["norm"] = {"scale": np.eye(H)[:3].sum(0).astype(np.float32)}
    p["lm_head"] = {"kernel": head}
    layer = dict(p["layers_0"])
    layer["self_attn"] = {**layer["self_attn"], "o_proj": {"kernel": np.zeros((H, H), np.float32)}}
    layer["mlp"] = {**layer["mlp"], "down_proj": {"kernel": np.zeros_like(layer["mlp"]["down_proj"]["kernel"])}}
    p["layers_0"] = layer
    engine = Engine(model.with_params(p), max_slots=2, page_size=8, num_pages=9, max_seq_len=32)
    stops = SamplingParams(temperature=0.0, max_tokens=6, stop_token_ids=codec.eos_ids)
    done = engine.generate([first, second], stops, [0, 1])
    assert [c.tokens.tolist() for c in done] == [[a, im_end], [end_of_text]]
    assert [c.finish_reason for c in done] == ["stop", "stop"]
    # config.json alone names only end-of-turn: end-of-text would not stop the second prompt.
    only_config = engine.generate([second], SamplingParams(temperature=0.0, max_tokens=3), [1])
    assert only_config[0].tokens.tolist() == [end_of_text, a, im_end]


def test_prompts_are_counted_in_tokens(qwen2, data):
    config = _config(qwen2, data)
    codec = build_codec(config)
    task = make_task(config)
    encoded = [codec.encode_prompt(task.problem(s, i)) for s, n in (("train", task.train_size),
                                                                      ("eval", task.eval_size)) for i in range(n)
               if not task.problem(s, i).messages]
    longest = max(len(e) for e in encoded)
    assert longest < max(len(r["prompt"]) for r in ROWS if "prompt" in r)  # BPE merges: fewer tokens than chars
    with pytest.raises(UsageError, match='a {"messages"} row needs the checkpoint\'s chat template'):
        longest_prompt(config, task, codec, positions=256)
    plain = _config(qwen2, data.parent / "plain.jsonl")
    (data.parent / "plain.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS if "prompt" in r))
    task = make_task(plain)
    assert longest_prompt(plain, task, codec, positions=256) == longest
    short = _config(qwen2, data.parent / "plain.jsonl", f"data.max_prompt_tokens={longest - 1}")
    with pytest.raises(UsageError, match=rf"plain.jsonl:\d+: its prompt has {longest} tokens, more than the "
                                         rf"{longest - 1} a prompt may have \(data.max_prompt_tokens\)"):
        longest_prompt(short, task, codec, positions=256)
    with pytest.raises(UsageError, match=rf"more than the {longest - 1} a prompt may have \(max_position_embeddings "
                                         rf"{longest + 7} less sampling.max_tokens 8\)"):
        longest_prompt(plain, task, codec, positions=longest + 7)
    wide = _config(qwen2, data.parent / "plain.jsonl", "data.max_prompt_tokens=300")
    with pytest.raises(UsageError, match="data.max_prompt_tokens 300 plus sampling.max_tokens 8 exceeds"):
        longest_prompt(wide, task, codec, positions=256)


@pytest.mark.slow
def test_a_large_built_in_task_under_a_subword_tokenizer_needs_a_prompt_cap(qwen2):
    config = load_config(None, [f'model.path="{qwen2}"'])  # arithmetic: 999,500 training prompts
    codec, task = build_codec(config), make_task(config)
    with pytest.raises(UsageError, match="has 1000000 prompts, too many to count .* set data.max_prompt_tokens"):
        longest_prompt(config, task, codec, positions=256)
    capped = load_config(None, [f'model.path="{qwen2}"', "data.max_prompt_tokens=12"])
    assert longest_prompt(capped, task, codec, positions=256) == 12
    with pytest.raises(UsageError, match=r"the prompt 'What is 3 plus 4\?' has \d+ tokens, more than data.max_prompt"):
        build_codec(load_config(None, [f'model.path="{qwen2}"', "data.max_prompt_tokens=2"])).encode_prompt(
            Problem(prompt="What is 3 plus 4?"))
    codefn = load_config(None, [f'model.path="{qwen2}"', 'data.task="codefn"'])
    task = make_task(codefn)  # 20,200 prompts: each one encoded
    expected = max(len(codec.encode_prompt(task.problem(s, i))) for s, n in (("train", task.train_size),
                                                                             ("eval", task.eval_size))
                   for i in range(n))
    assert longest_prompt(codefn, task, codec, positions=256) == expected


def test_chat_rendering_matches_transformers(qwen2, data):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(qwen2))
    config = _config(qwen2, data, "data.chat_template=true")
    codec = build_codec(config)
    assert codec.bos_id is None and codec.template_digest == hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest()
    task = make_task(config)
    problems = [task.problem("train", i) for i in range(task.train_size)]
    problems += [task.problem("eval", i) for i in range(task.eval_size)]
    chats = [p for p in problems if p.messages]
    assert len(chats) == 1 and len(problems) == len(ROWS)
    for p in [*problems[:3], *chats]:
        messages = [{"role": r, "content": c} for r, c in p.messages] or [{"role": "user", "content": p.prompt}]
        expected = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert codec.prompt_text(p) == expected
        assert codec.encode_prompt(p).tolist() == hf(expected, add_special_tokens=False)["input_ids"]
    assert codec.prompt_text(chats[0]).startswith("<|im_start|>system\nAnswer with a number.<|im_end|>\n")
    assert codec.prompt_text(problems[0]).endswith("<|im_end|>\n<|im_start|>assistant\n")
    longest = longest_prompt(config, task, codec, positions=256)
    assert longest == max(len(codec.encode_prompt(p)) for p in problems)


def test_a_chat_template_must_exist_and_stay_the_same(qwen2, data, tmp_path):
    import shutil

    shutil.copytree(qwen2, tmp_path / "plain")
    config = json.loads((tmp_path / "plain" / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (tmp_path / "plain" / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError, match=r"data.chat_template is true but model.path .* has no chat template"):
        build_codec(load_config(None, [f'model.path="{tmp_path / "plain"}"', "data.chat_template=true"]))
    with pytest.raises(UsageError, match="the built-in model has no chat template"):
        build_codec(load_config(None, ["data.chat_template=true"]))
    recorded = hashlib.sha256(b"another template").hexdigest()
    with pytest.raises(UsageError, match="is not the one the run was started with"):
        build_codec(_config(qwen2, data, "data.chat_template=true", f'data.chat_template_digest="{recorded}"'))
    with pytest.raises(UsageError, match="data.chat_template_digest"):
        load_config(None, ['data.chat_template_digest="abc"', "data.chat_template=true"])


def test_template_selection_sandbox_and_bounds():
    assert select_template([{"name": "tool_use", "template": "x"}, {"name": "default", "template": "y"}],
                           source="t") == "y"
    with pytest.raises(TemplateError, match="none named 'default'"):
        select_template([{"name": "tool_use", "template": "x"}], source="t")
    with pytest.raises(TemplateError, match="must be a string or a list"):
        select_template(3, source="t")
    with pytest.raises(TemplateError, match="chat template line 1"):
        ChatTemplate("{% if %}")
    unsafe = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(TemplateError, match="failed to render|unsafe"):
        unsafe.render([{"role": "user", "content": "hi"}])
    mutate = ChatTemplate("{{ messages.append(1) }}")
    with pytest.raises(TemplateError, match="unsafe operation"):
        mutate.render([{"role": "user", "content": "hi"}])
    refuse = ChatTemplate("{{ raise_exception('only user turns') }}")
    with pytest.raises(TemplateError, match="refused the prompt: only user turns"):
        refuse.render([{"role": "user", "content": "hi"}])
    dated = ChatTemplate("{% if strftime_now is defined %}{{ strftime_now('%Y') }}{% else %}fixed{% endif %}")
    assert dated.render([]) == "fixed"  # no clock: the same prompt on every replay
    assert ChatTemplate("{{ messages[0].content | tojson }}").render([{"role": "u", "content": "é<"}]) == '"é<"'
