"""A hostile checkpoint gets one-line refusals: links and shard names that leave the directory, JSON
that is not UTF-8, nests without end or holds non-finite or endless numbers, dimensions and floats
out of range, and chat templates whose work or memory has no end (refused by the render's counted
budget, not by a clock)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import pytest

from runtime.errors import UsageError
from runtime.model import ModelConfig, RopeScaling, load_hf
from runtime.model.chat_template import ChatTemplate, TemplateError
from runtime.model.checkpoint_files import MAX_JSON_DEPTH, read_json
from runtime.model.config import MAX_DIMENSIONS
from runtime.model.hf_convert import config_from_hf
from runtime.model.hf_text import checkpoint_text
from runtime.model.template_sandbox import MAX_CALL_DEPTH, MAX_OPERATIONS, MAX_VALUE_CHARS
from tests.runtime.model.tiny_checkpoint import CHAT_TEMPLATE, write_checkpoint

MESSAGES = [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "What is 3 plus 4?"}]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pristine") / "ckpt"
    write_checkpoint(directory, ["What is 3 plus 4?", "7"])
    return directory


@pytest.fixture
def ckpt(pristine, tmp_path):
    copy = tmp_path / "ckpt"
    shutil.copytree(pristine, copy)
    return copy


def _load(directory: pathlib.Path):
    """What ``rlx run --model`` reads of a checkpoint: its text files, then its weights."""
    hf = read_json(directory, "config.json")
    assert hf is not None
    checkpoint_text(directory, hf, chat_template=True)
    return load_hf(directory)


def _one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


# -- links, shard names and special files


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "tokenizer_config.json",
                                  "generation_config.json", "model.safetensors"])
def test_a_checkpoint_file_that_is_a_link_is_refused(ckpt, tmp_path, name):
    elsewhere = tmp_path / "secret"
    shutil.move(ckpt / name, elsewhere)  # the same contents: only the link is wrong
    os.symlink(elsewhere, ckpt / name)
    with pytest.raises(UsageError) as e:
        _load(ckpt)
    assert _one_line(e).startswith(f"{ckpt / name} is a symbolic link (to {str(elsewhere)!r})")


def _index(directory: pathlib.Path, shard: str) -> None:
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), framework="numpy") as f:
        names = list(f.keys())
    (directory / "model.safetensors").unlink()
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict.fromkeys(names, shard)}))


@pytest.mark.parametrize("kind", ["parent", "absolute", "link"])
def test_shard_names_of_the_index_stay_in_the_checkpoint(ckpt, tmp_path, kind):
    outside = tmp_path / "outside.safetensors"
    shutil.copyfile(ckpt / "model.safetensors", outside)  # a readable shard, outside the checkpoint
    if kind == "parent":
        shard = "../outside.safetensors"
    elif kind == "absolute":
        shard = str(outside)
    else:
        shard = "model-00001-of-00001.safetensors"
        os.symlink(outside, ckpt / shard)
    _index(ckpt, shard)
    with pytest.raises(UsageError) as e:
        load_hf(ckpt)
    if kind == "link":
        assert _one_line(e).startswith(f"{ckpt / shard} is a symbolic link")
    else:
        assert _one_line(e) == (f"{ckpt}: model.safetensors.index.json weight_map names the file {shard!r}; accepted: "
                                "plain names of files in the checkpoint directory (no '/', '..' or absolute paths)")


def test_a_fifo_is_refused_rather_than_read(ckpt):
    os.unlink(ckpt / "tokenizer_config.json")
    os.mkfifo(ckpt / "tokenizer_config.json")  # reading one would wait for a writer
    with pytest.raises(UsageError) as e:
        _load(ckpt)
    assert _one_line(e).startswith(f"{ckpt / 'tokenizer_config.json'} is not a regular file")


def test_the_honest_checkpoint_still_loads(ckpt):
    model = _load(ckpt)
    assert model.config.num_layers == 1 and model.tokenizer is not None


# -- the JSON reader


BAD_JSON = {
    "not UTF-8": (b'{"model_type": "qwen2\xff"}', "is not UTF-8 text (byte 21"),
    "nested": (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", f"nests more than {MAX_JSON_DEPTH} levels"),
    "nested below the parser's limit": (b'{"a": ' + b"[" * 200 + b"]" * 200 + b"}",
                                        f"nests more than {MAX_JSON_DEPTH} levels"),
    "a huge int": (b'{"vocab_size": 1' + b"0" * 5000 + b"}", "is not accepted JSON: Exceeds the limit (4300 digits)"),
    "NaN": (b'{"rms_norm_eps": NaN}', "is not accepted JSON: NaN is not a JSON number; accepted: finite numbers"),
    "Infinity": (b'{"rope_theta": Infinity}', "is not accepted JSON: Infinity is not a JSON number"),
    "an overflowing float": (b'{"rope_theta": 1e400}', "is not accepted JSON: the number 1e400 is out of a float's range"),
    "not an object": (b"[1, 2]", "must hold a JSON object, got list"),
}


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json", "generation_config.json"])
@pytest.mark.parametrize("case", sorted(BAD_JSON))
def test_bad_json_is_one_line_naming_the_file(ckpt, name, case):
    data, expected = BAD_JSON[case]
    (ckpt / name).write_bytes(data)
    with pytest.raises(UsageError) as e:
        _load(ckpt)
    message = _one_line(e)
    assert message.startswith(f"{ckpt / name} ") and expected in message, message


def test_the_index_and_tokenizer_are_read_bounded_too(ckpt):
    _index(ckpt, "model.safetensors")
    (ckpt / "model.safetensors.index.json").write_bytes(b'{"weight_map": {"x": "\xc3"}}')
    with pytest.raises(UsageError, match="model.safetensors.index.json is not UTF-8 text"):
        load_hf(ckpt)
    (ckpt / "tokenizer.json").write_bytes(b"\xff\xfe")
    with pytest.raises(UsageError, match="tokenizer.json is not UTF-8 text"):
        checkpoint_text(ckpt, json.loads((ckpt / "config.json").read_text()))


# -- dimensions and floats


HF = {"model_type": "llama", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.mark.parametrize(("field", "ours"), [("num_hidden_layers", "num_layers"), ("vocab_size", "vocab_size"),
                                             ("hidden_size", "hidden_size"), ("intermediate_size", "intermediate_size"),
                                             ("num_attention_heads", "num_heads"),
                                             ("max_position_embeddings", "max_position_embeddings")])
def test_every_dimension_is_bounded_before_anything_is_sized(field, ours):
    with pytest.raises(UsageError) as e:
        config_from_hf({**HF, field: 1_000_000_000}, source="c/config.json")
    assert _one_line(e) == f"c/config.json: model config {ours}=1000000000: at most {MAX_DIMENSIONS[ours]} is accepted"


def test_the_product_of_dimensions_is_bounded_and_real_models_pass():
    llama_405b = dict(vocab_size=128256, hidden_size=16384, num_layers=126, num_heads=128, num_kv_heads=8,
                      intermediate_size=53248, max_position_embeddings=131072)
    assert 4.0e11 < ModelConfig(**llama_405b).parameter_count < 4.1e11  # it has 405e9 parameters
    huge = dict(llama_405b, num_layers=1024, hidden_size=65536, intermediate_size=1 << 19)
    with pytest.raises(UsageError, match=r"model config of 1.15e\+14 parameters .* at most 4.4e\+12 are accepted"):
        ModelConfig(**huge)
    with pytest.raises(UsageError, match="head_dim=4096: must be a positive even integer, at most 2048"):
        ModelConfig(**llama_405b, head_dim=4096)
    with pytest.raises(UsageError, match="num_kv_heads=256 exceeds num_heads=128"):
        ModelConfig(**dict(llama_405b, num_kv_heads=256))


@pytest.mark.parametrize(("changes", "expected"), [
    ({"rope_theta": float("inf")}, "rope_theta=inf: must be a finite number > 0 and <= 1e+15"),
    ({"rope_theta": -1.0}, "rope_theta=-1.0: must be a finite number > 0"),
    ({"rms_norm_eps": float("inf")}, "rms_norm_eps=inf: must be a finite number > 0 and <= 1"),
    ({"initializer_range": float("nan")}, "initializer_range=nan: must be a finite number >= 0"),
])
def test_floats_must_be_finite_and_in_range(changes, expected):
    with pytest.raises(UsageError, match=expected.replace("+", r"\+")):
        ModelConfig(vocab_size=8, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=16,
                    **changes)


@pytest.mark.parametrize(("scaling", "expected"), [
    ({"rope_type": "linear", "factor": float("inf")}, "rope_scaling.factor=inf: must be a finite number > 0"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": float("inf")},
     "rope_scaling.high_freq_factor=inf: must be a finite number"),
    ({"rope_type": "llama3", "factor": -8.0}, "rope_scaling.factor=-8.0: must be a finite number > 0"),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 10**12},
     "original_max_position_embeddings=1000000000000: must be an integer in"),
])
def test_rope_scaling_must_be_finite_and_positive(scaling, expected):
    with pytest.raises(UsageError, match=expected):
        RopeScaling(**scaling)


@pytest.mark.parametrize(("changes", "expected"), [
    ({"rms_norm_eps": "1e-6"}, "rms_norm_eps='1e-6' is not accepted; it must be a number"),
    ({"rope_theta": 10**400}, "rope_theta=100000000000... (401 digits) is out of a float's range"),
    ({"rope_scaling": [1, 2]}, "rope_scaling must be an object or null, got list"),
    ({"rope_theta": True}, "rope_theta=True is not accepted; it must be a number"),
])
def test_config_numbers_of_the_wrong_type_are_one_line(changes, expected):
    with pytest.raises(UsageError) as e:
        config_from_hf({**HF, **changes}, source="c/config.json")
    assert _one_line(e) == f"c/config.json: {expected}"


# -- chat templates


ATTACKS = {
    "nested range loops": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                           f"did more than {MAX_OPERATIONS} operations"),
    "nested loops over a list": ("{% set xs = range(100000)|list %}{% for i in xs %}{% for j in xs %}"
                                 "{% endfor %}{% endfor %}", f"did more than {MAX_OPERATIONS} operations"),
    "string repetition": ("{{ 'x' * 1500000000 }}", f"would build str * 1500000000 of 1500000000 characters or "
                                                    f"items; at most {MAX_VALUE_CHARS}"),
    "repetition by a variable": ("{% set n = 1500000000 %}{% set s = n * 'x' %}", "would build str * 1500000000"),
    "list repetition of a long string": ("{% set s = 'x' * 4000000 %}{{ ([s] * 1000)|join }}",
                                         "would build list * 1000 of 4000003000"),
    "doubling by ~": ("{% set ns = namespace(s='x' * 4000000) %}{% for i in range(30) %}{% set ns.s = ns.s ~ ns.s %}"
                      "{% endfor %}", "would build a string of 8000000"),
    "shared references": ("{% set s = 'x' * 4000000 %}{% set a = [s, s, s] %}{{ a|map('string')|join }}",
                          "would build a value of at least 8000005"),
    "a linear test in a loop": ("{% set s = 'x' * 4000000 %}{% for i in range(1000) %}{% if 'y' in s %}{% endif %}"
                                "{% endfor %}", "built more than"),
    "a macro calling itself": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
                               f"nests macro or recursive-loop calls more than {MAX_CALL_DEPTH} deep"),
    "a recursive loop without end": ("{% for x in [[1]] recursive %}{{ loop([x]) }}{% endfor %}",
                                     f"more than {MAX_CALL_DEPTH} deep"),
    "a power": ("{{ 2 ** 100000000 }}", "raises an integer to the power 100000000"),
    "center": ("{{ 'x'|center(1500000000) }}", "would build center(1500000000)"),
    "ljust": ("{{ 'x'.ljust(1500000000) }}", "would build str.ljust(1500000000)"),
    "str.format width": ("{{ '{:>1500000000}'.format('x') }}", "formats with the width '1500000000' (str.format)"),
    "% width": ("{{ '%1500000000s' % 'x' }}", "formats with the width '1500000000' (%)"),
    "format filter width": ("{{ '%1500000000s'|format('x') }}", "formats with the width '1500000000' (%)"),
    "replace of the empty string": ("{% set s = 'x' * 4000 %}{{ s.replace('', s) }}", "would build a replace of"),
    "indent": ("{{ ('\n' * 400000)|indent(100) }}", "would build an indent of 40400100"),
    "tojson of shared strings": ("{% set s = 'x' * 4000000 %}{{ [s, s]|tojson }}", "would build a value of at least 8000004"),
    "deep nesting": ("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "nests its expressions or blocks too deeply"),
    "randomness": ("{{ [1, 2]|random }}", "No filter named 'random'"),
    "lipsum": ("{{ lipsum(1000000) }}", "'lipsum' is undefined"),
}


@pytest.mark.parametrize("case", sorted(ATTACKS))
def test_a_template_that_would_not_end_or_would_exhaust_memory_is_refused(case):
    source, expected = ATTACKS[case]
    with pytest.raises(TemplateError) as e:
        ChatTemplate(source).render(MESSAGES)
    assert expected in _one_line(e)


RICH_TEMPLATE = (
    "{%- set ns = namespace(system='', count=0) -%}"
    "{%- macro turn(role, text) -%}<|{{ role }}|>{{ text | trim }}{{ eos_token }}{%- endmacro -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' %}{% set ns.system = m.content %}{% continue %}{% endif -%}"
    "{%- set ns.count = ns.count + 1 -%}"
    "{{ turn(m.role, m.content) }}{% if not loop.last %}\n{% endif -%}"
    "{%- if m.role in ['user', 'assistant'] and loop.index0 % 2 == 0 %}[{{ loop.index }}/{{ loop.length }}]{% endif -%}"
    "{%- endfor -%}"
    "{{ '\n' ~ (messages | map(attribute='role') | join(',')) ~ '|' ~ (ns.system[:6] | upper) }}"
    "{{ ' %d/%s' % (ns.count, messages | length) }}{{ '{0}-{1}'.format(2 ** 3, 'x' * 3) }}"
    "{{ {'a': [1, 2.5, none, true]} | tojson }}{{ messages[-1].content.split(' ') | reverse | list | length }}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif -%}"
)


@pytest.mark.parametrize("source", [CHAT_TEMPLATE, RICH_TEMPLATE])
def test_an_honest_template_renders_as_the_plain_sandbox_renders_it(source):
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from runtime.model.chat_template import _raise_exception, _tojson

    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    plain.filters["tojson"] = _tojson
    plain.globals["raise_exception"] = _raise_exception
    tokens = {"eos_token": "<|end|>"}
    messages = [*MESSAGES, {"role": "assistant", "content": "7 "}, {"role": "user", "content": "And 2 plus 2?"}]
    expected = plain.from_string(source).render(messages=messages, add_generation_prompt=True, **tokens)
    template = ChatTemplate(source, tokens)
    assert template.render(messages) == expected == template.render(messages)
    if source == RICH_TEMPLATE:  # each construct took part
        assert expected.startswith("<|user|>What is 3 plus 4?<|end|><|assistant|>7<|end|>[3/4]<|user|>")
        assert expected.endswith('\nsystem,user,assistant,user|ANSWER 3/48-xxx{"a": [1, 2.5, null, true]}4<|assistant|>')


def test_a_long_honest_conversation_stays_within_the_budget():
    # 2,000 turns of 1,000 characters (2 MiB of prompt); the template looks at messages|length on
    # every turn, as some released templates do.
    source = ("{% for m in messages %}{% if loop.index0 < messages|length %}<|{{ m.role }}|>{{ m.content }}"
              "{% endif %}{% endfor %}")
    messages = [{"role": ["user", "assistant"][i % 2], "content": f"{i:04d}" * 250} for i in range(2000)]
    text = ChatTemplate(source).render(messages)
    assert len(text) == sum(len(m["role"]) + 4 + 1000 for m in messages)
