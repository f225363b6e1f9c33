"""``rlx export``: a version of a run as a Hugging Face checkpoint that Transformers loads.

Two real runs: the shared small run of the built-in model, and a 2-step run started from a
sharded Qwen3 checkpoint that Transformers wrote (random weights, the character tokenizer).
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from tokenizers import Tokenizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from runtime.cli import main  # noqa: E402
from runtime.commands.export import shard_size  # noqa: E402
from runtime.errors import UsageError  # noqa: E402
from runtime.export import builtin_form, export_version  # noqa: E402
from runtime.model import BOS_ID, Model, ModelConfig, char_tokenizer  # noqa: E402
from runtime.model.hf import tokenizer_config  # noqa: E402
from runtime.model.hf_convert import config_from_hf  # noqa: E402
from runtime.params import ParamStore  # noqa: E402
from tests.runtime import small_run as small  # noqa: E402

TOL = 1e-4
HF_STEPS = 4


def _safetensors(directory) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    tensors: dict[str, np.ndarray] = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(directory, name)))
    return tensors


def _transformers_logits(directory, tokens: np.ndarray) -> np.ndarray:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(tokens.astype(np.int64))).logits.float().numpy()


def _tokens(vocab: int) -> np.ndarray:
    return np.random.default_rng(3).integers(4, vocab, (2, 10)).astype(np.int32)


@pytest.fixture(scope="module")
def checkpoint_run(tmp_path_factory):
    """(run directory, checkpoint) of a 4-step run started from a sharded Qwen3 checkpoint; it
    keeps only its newest versions (and 0), so older ones are retired."""
    root = tmp_path_factory.mktemp("checkpoint_run")
    tokenizer = char_tokenizer()
    hf_config = transformers.Qwen3Config(
        vocab_size=tokenizer.get_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=24, max_position_embeddings=64,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_config)
    checkpoint = root / "ckpt"
    model.save_pretrained(checkpoint, max_shard_size="40KB")
    assert (checkpoint / "model.safetensors.index.json").is_file()
    tokenizer.save(str(checkpoint / "tokenizer.json"))
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(tokenizer)))
    small.write_sums(root / "sums.jsonl")
    out = root / "run"
    # A random model earns no reward, so its policy gradient is zero: weight decay moves the
    # weights, so that a trained version differs from the checkpoint.
    overrides = ['workers.mode="threads"', *small.TINY, "trainer.weight_decay=0.5", "trainer.learning_rate=0.01",
                 "params.keep_newest=1", "scheduling.max_staleness=0"]
    code = main(["run", "--out", str(out), "--no-progress", "--steps", str(HF_STEPS), "--model", str(checkpoint),
                 "--data", str(root / "sums.jsonl"), *[x for o in overrides for x in ("--set", o)]])
    assert code == 0
    return out, checkpoint


@pytest.mark.slow
def test_version_0_of_a_checkpoint_run_gives_back_the_checkpoint_bit_for_bit(checkpoint_run, tmp_path):
    run_dir, checkpoint = checkpoint_run
    out = tmp_path / "v0"
    done = export_version(str(run_dir), 0, out, max_shard_bytes=40_000)
    assert done.version == 0 and done.source == str(checkpoint) and done.dtypes == ("float32",)
    assert "model.safetensors.index.json" in done.files
    original, exported = _safetensors(checkpoint), _safetensors(out)
    assert sorted(exported) == sorted(original) and len(original) == 3 + 2 * 11  # 11 tensors a Qwen3 layer
    for name, tensor in original.items():
        assert exported[name].dtype == tensor.dtype and exported[name].shape == tensor.shape, name
        assert exported[name].tobytes() == tensor.tobytes(), name
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (checkpoint / name).read_bytes(), name
    assert sorted(os.listdir(out)) == sorted(done.files)


def test_a_trained_version_loads_in_transformers_with_the_same_logits(checkpoint_run, tmp_path):
    run_dir, checkpoint = checkpoint_run
    out = tmp_path / "trained"
    assert main(["export", str(run_dir), "--version", str(HF_STEPS), "--out", str(out)]) == 0
    assert (out / "model.safetensors").is_file()  # 5GiB shards by default: one file
    params = ParamStore.open(str(run_dir / "params")).get(HF_STEPS)
    config = config_from_hf(json.loads((checkpoint / "config.json").read_text()))
    assert config.architecture == "qwen3" and config.head_dim == 24
    tokens = _tokens(config.vocab_size)
    ours = np.asarray(Model(config, params).logits(tokens))
    theirs = _transformers_logits(out, tokens)
    assert np.abs(theirs).max() > 0.1
    assert np.abs(ours - theirs).max() <= TOL
    name = "model.layers.0.self_attn.q_norm.weight"
    assert np.abs(_safetensors(out)[name] - _safetensors(checkpoint)[name]).min() > 1e-4
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert hf_tok("12+3=", add_special_tokens=False)["input_ids"] == char_tokenizer().encode("12+3=").ids


def test_bfloat16_export_and_float32_override(checkpoint_run, tmp_path):
    run_dir, _ = checkpoint_run
    done = export_version(str(run_dir), HF_STEPS, tmp_path / "bf16", dtype="bfloat16")
    assert done.dtypes == ("bfloat16",)
    config = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and "torch_dtype" not in config
    stored = ParamStore.open(str(run_dir / "params")).get(HF_STEPS)
    exported = _safetensors(tmp_path / "bf16")["model.norm.weight"]
    import ml_dtypes

    np.testing.assert_array_equal(exported, stored["norm"]["scale"].astype(ml_dtypes.bfloat16))


@pytest.mark.slow
def test_the_built_in_model_exports_with_its_character_tokenizer(small_run, tmp_path):
    run_dir, summary, _ = small_run
    out = tmp_path / "builtin"
    version = summary["final_version"]
    done = export_version(run_dir, version, out, max_shard_bytes=20_000)
    assert done.source == "built-in" and done.digest == summary["final_digest"]
    assert len([f for f in done.files if f.endswith(".safetensors")]) > 1
    assert json.loads((out / "generation_config.json").read_text()) == {
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "do_sample": False, "max_new_tokens": 4}
    exported_tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert exported_tokenizer.get_vocab() == char_tokenizer().get_vocab()
    assert exported_tokenizer.encode("1+2=").ids == [BOS_ID, *char_tokenizer().encode("1+2=").ids]
    params = ParamStore.open(os.path.join(run_dir, "params")).get(version)
    config = config_from_hf(json.loads((out / "config.json").read_text()))
    assert (config.hidden_size, config.num_layers, config.num_kv_heads) == (32, 1, 1)
    tokens = _tokens(config.vocab_size)
    ours = np.asarray(Model(config, params).logits(tokens))
    theirs = _transformers_logits(out, tokens)
    assert np.abs(theirs).max() > 0.1
    assert np.abs(ours - theirs).max() <= TOL


def _rlx_greedy(config, params, prompts: list[str]) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt ids, greedy completion ids) of rlx's own codec and engine for ``prompts``."""
    from runtime.inference import SamplingParams
    from runtime.session import build_session
    from runtime.tasks.base import Problem

    session = build_session(config, log=lambda m: None, judge=False, warm=False)
    session.engine.update_params(params)
    ids = session.codec.encode_prompts([Problem(p) for p in prompts])
    done = session.engine.generate(ids, SamplingParams(temperature=0.0, max_tokens=config.max_tokens),
                                   list(range(len(ids))))
    return [i.tolist() for i in ids], [c.tokens.tolist() for c in done]


def test_an_exported_built_in_model_generates_in_transformers_what_rlx_generates(small_run, tmp_path):
    run_dir, summary, config = small_run
    out = tmp_path / "export"
    export_version(run_dir, summary["final_version"], out)
    params = ParamStore.open(os.path.join(run_dir, "params")).get(summary["final_version"])
    # The run's own sums (a, b < 5) and some it never saw, no longer than its longest prompt (the
    # engine's prefill is sized to it).
    prompts = [f"{a}+{b}=" for a in range(5) for b in range(5)] + ["5+5=", "9+8=", "7+0=", "6+9="]
    rlx_prompts, rlx_completions = _rlx_greedy(config, params, prompts)
    assert all(ids[0] == BOS_ID for ids in rlx_prompts)
    assert sum(c[-1:] == [2] for c in rlx_completions) >= len(prompts) // 2  # the model answers and stops

    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert model.generation_config.max_new_tokens == config.max_tokens and not model.generation_config.do_sample
    theirs = []
    for prompt, ids in zip(prompts, rlx_prompts, strict=True):
        encoded = hf_tok(prompt, return_tensors="pt")  # the tokenizer's own special tokens, as a user calls it
        assert encoded["input_ids"][0].tolist() == ids, prompt
        with torch.no_grad():
            new = model.generate(**encoded)[0, len(ids):].tolist()  # greedy, by the exported generation config
        theirs.append(new[: new.index(2) + 1] if 2 in new else new)
    assert theirs == rlx_completions
    assert hf_tok.decode(hf_tok(prompts[7])["input_ids"], skip_special_tokens=True) == prompts[7]


def test_unknown_and_retired_versions_are_one_line_refusals(checkpoint_run, tmp_path):
    run_dir, _ = checkpoint_run
    kept = ParamStore.open(str(run_dir / "params")).versions()
    retired = sorted(set(range(HF_STEPS + 1)) - set(kept))
    assert retired and 0 in kept and HF_STEPS in kept, kept
    listed = ", ".join(map(str, range(HF_STEPS + 1)))
    with pytest.raises(UsageError, match=rf"^version 99 is not a version of run 'run'; it published {listed}$"):
        export_version(str(run_dir), 99, tmp_path / "a")
    with pytest.raises(UsageError, match=rf"^version {retired[0]} of run 'run' was retired from its parameter store "
                                         rf".*; kept versions: {', '.join(map(str, kept))}$"):
        export_version(str(run_dir), retired[0], tmp_path / "a")
    assert not (tmp_path / "a").exists()


def test_an_occupied_out_is_refused_and_an_empty_one_taken(small_run, tmp_path, capsys):
    run_dir, summary, _ = small_run
    last = summary["final_version"]
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert main(["export", run_dir, "--version", str(last), "--out", str(tmp_path / "full")]) == 2
    err = capsys.readouterr().err
    assert err == f"rlx: error: --out {str(tmp_path / 'full')!r} exists and is not empty; give a new or empty directory\n"
    (tmp_path / "empty").mkdir()  # an empty directory is taken
    export_version(run_dir, last, tmp_path / "empty")
    assert (tmp_path / "empty" / "model.safetensors").is_file()
    assert [p for p in os.listdir(tmp_path) if p.endswith(".export")] == []


def test_weights_that_differ_from_the_ledger_are_not_exported(small_run, tmp_path):
    run_dir, summary, _ = small_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    # Version 3 of the store replaced by other weights (version 2's): what the ledger does not name.
    last = summary["final_version"]
    store = ParamStore.open(str(copy / "params"))
    other = store.get(last - 1)
    store.delete(last)
    store.put(last, other)
    with pytest.raises(UsageError, match=rf"stored version {last} of run 'run' has digest .* but the ledger published"):
        export_version(str(copy), last, tmp_path / "out")


def test_a_checkpoint_that_is_gone_and_a_model_without_hf_form_are_named(checkpoint_run, tmp_path):
    run_dir, checkpoint = checkpoint_run
    moved = tmp_path / "run"
    shutil.copytree(run_dir, moved)
    shutil.move(str(checkpoint), str(tmp_path / "elsewhere"))
    try:
        with pytest.raises(UsageError, match=rf"started from the checkpoint '{checkpoint}', which has no config.json"):
            export_version(str(moved), 0, tmp_path / "out")
    finally:
        shutil.move(str(tmp_path / "elsewhere"), str(checkpoint))
    odd = ModelConfig(vocab_size=8, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=16,
                      qkv_bias=True)
    with pytest.raises(UsageError, match="run 'r' trained a built-in model that has no Hugging Face form: llama "
                                         "biases q/k/v and o together"):
        builtin_form(odd, char_tokenizer(), "r")


def test_shard_sizes():
    assert shard_size("5GiB") == 5 * 2**30 and shard_size("40KB") == 40_000 and shard_size("123") == 123
    for bad in ("0", "5 TB", "-1", "big"):
        with pytest.raises(Exception, match="is not a size"):
            shard_size(bad)
