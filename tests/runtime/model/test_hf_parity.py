"""Logit parity with Hugging Face Transformers (PyTorch, CPU) in both directions.

Tiny random models (hidden 64, 2 layers, vocab 97) of the four architectures (Llama, Mistral,
Qwen2, Qwen3) cover grouped-query attention, tied embeddings, q/k/v (and o) biases, Qwen3's q/k
norms, a head_dim other than hidden / heads, a sliding window no shorter than the sequences and
non-default rope_theta. Weights are drawn wider than the
default init (std 0.2, norm scales around 1) so that a wrong transpose, rotary convention or
bias shows up far above the 1e-4 tolerance.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from runtime.errors import UsageError  # noqa: E402
from runtime.model import (  # noqa: E402
    Model,
    ModelConfig,
    RopeScaling,
    char_tokenizer,
    load_hf,
    save_hf,
)
from runtime.model.hf_convert import config_to_hf  # noqa: E402

VOCAB = 97
TOL = 1e-4

# name -> (HF config class, kwargs)
VARIANTS = {
    "llama_gqa_untied_theta": (
        "LlamaConfig",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=False,
            rope_theta=500.0,
        ),
    ),
    "llama_mha_tied_bias": (
        "LlamaConfig",
        dict(
            num_attention_heads=4,
            num_key_value_heads=4,
            tie_word_embeddings=True,
            attention_bias=True,
        ),
    ),
    "llama_llama3_rope": (
        "LlamaConfig",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            # A 16-token original context puts head_dim 16's frequencies in all three bands.
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 50000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ),
    ),
    "mistral_gqa_window_head_dim": (
        "MistralConfig",
        # The window covers the 12-token test sequences, where it is full causal attention.
        dict(num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=16),
    ),
    "mistral_no_window_tied": (
        "MistralConfig",
        dict(
            num_attention_heads=4,
            num_key_value_heads=4,
            sliding_window=None,
            tie_word_embeddings=True,
        ),
    ),
    "qwen3_gqa_head_dim_untied": (
        "Qwen3Config",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=24,
            tie_word_embeddings=False,
            rope_theta=1e6,
        ),
    ),
    "qwen3_tied_bias": (
        "Qwen3Config",
        dict(
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,
            tie_word_embeddings=True,
            attention_bias=True,
        ),
    ),
    "qwen2_gqa_tied_theta": (
        "Qwen2Config",
        dict(
            num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True, rope_theta=1e6
        ),
    ),
}


def _hf_model(variant: str, seed: int = 0):
    config_cls, kwargs = VARIANTS[variant]
    config = getattr(transformers, config_cls)(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        **kwargs,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    return model


def _hf_logits(model, tokens: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    with torch.no_grad():
        out = model(
            input_ids=torch.from_numpy(tokens.astype(np.int64)),
            attention_mask=None if mask is None else torch.from_numpy(mask.astype(np.int64)),
        )
    return out.logits.float().numpy()


def _tokens(seed: int, shape=(2, 12)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, shape).astype(np.int32)


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_load_hf_matches_transformers_logits(variant, tmp_path):
    hf_model = _hf_model(variant)
    hf_model.save_pretrained(tmp_path)
    model = load_hf(tmp_path)
    assert model.config.architecture == hf_model.config.model_type
    assert model.tokenizer is None
    tokens = _tokens(1)
    ours = np.asarray(model.logits(tokens))
    theirs = _hf_logits(hf_model, tokens)
    assert ours.shape == (2, 12, VOCAB) and ours.dtype == np.float32
    assert np.abs(theirs).max() > 1.0  # the comparison is not between near-zero logits
    assert np.abs(ours - theirs).max() <= TOL


def test_left_and_right_padding_match_transformers(tmp_path):
    hf_model = _hf_model("llama_gqa_untied_theta")
    hf_model.save_pretrained(tmp_path)
    model = load_hf(tmp_path)
    tokens = _tokens(2, (3, 10))
    lengths = np.array([10, 6, 3])
    right = (np.arange(10)[None, :] < lengths[:, None]).astype(np.int32)
    left = right[:, ::-1].copy()
    for mask in (right, left):
        ours = np.asarray(model.logits(tokens, mask))
        theirs = _hf_logits(hf_model, tokens, mask)
        real = mask.astype(bool)
        assert np.abs(ours[real] - theirs[real]).max() <= TOL
        assert np.isfinite(ours).all()
    # The same prompt gives the same logits right-padded, left-padded and alone.
    alone = np.asarray(model.logits(tokens[1:2, :6]))[0]
    ours_right = np.asarray(model.logits(tokens, right))[1, :6]
    shifted = tokens.copy()
    shifted[1, 4:] = tokens[1, :6]
    ours_left = np.asarray(model.logits(shifted, left))[1, 4:]
    np.testing.assert_allclose(ours_right, alone, atol=1e-5, rtol=0)
    np.testing.assert_allclose(ours_left, alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "variant",
    [
        "llama_gqa_untied_theta",
        "mistral_gqa_window_head_dim",
        "qwen2_gqa_tied_theta",
        "qwen3_gqa_head_dim_untied",
    ],
)
def test_sharded_checkpoint_loads(variant, tmp_path):
    hf_model = _hf_model(variant, seed=3)
    hf_model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1
    tokens = _tokens(4)
    ours = np.asarray(load_hf(tmp_path).logits(tokens))
    assert np.abs(ours - _hf_logits(hf_model, tokens)).max() <= TOL


def _our_model(config: ModelConfig, seed: int) -> Model:
    model = Model.init(config, key=jax.random.key(seed), tokenizer=char_tokenizer())
    keys = iter(jax.random.split(jax.random.key(seed + 1), 64))

    def widen(path, x):
        noise = jax.random.normal(next(keys), x.shape, x.dtype)
        return 1.0 + 0.2 * noise if path[-1].key == "scale" else 0.2 * noise

    return model.with_params(jax.tree_util.tree_map_with_path(widen, model.params))


@pytest.mark.parametrize(
    "arch, kwargs",
    [
        ("llama", dict(num_kv_heads=2, rope_theta=2500.0)),
        ("llama", dict(num_kv_heads=4, tie_word_embeddings=True, qkv_bias=True, o_bias=True)),
        ("qwen2", dict(num_kv_heads=1, qkv_bias=True, tie_word_embeddings=True, rope_theta=1e6)),
        ("llama", dict(num_kv_heads=2, rope_scaling=RopeScaling("linear", factor=4.0))),
        ("mistral", dict(num_kv_heads=2, head_dim=8, sliding_window=32)),
        ("mistral", dict(num_kv_heads=1, tie_word_embeddings=True)),
        ("qwen3", dict(num_kv_heads=2, head_dim=24, qk_norm=True, rope_theta=1e6)),
        (
            "qwen3",
            dict(
                num_kv_heads=4,
                qk_norm=True,
                qkv_bias=True,
                o_bias=True,
                tie_word_embeddings=True,
            ),
        ),
    ],
)
@pytest.mark.slow
def test_save_hf_loads_in_transformers(arch, kwargs, tmp_path):
    vocab = char_tokenizer().get_vocab_size()
    config = ModelConfig(
        vocab_size=vocab,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        intermediate_size=96,
        architecture=arch,
        max_position_embeddings=64,
        **kwargs,
    )
    model = _our_model(config, seed=5)
    save_hf(tmp_path, model, max_shard_bytes=60_000)
    assert (tmp_path / "model.safetensors.index.json").is_file()
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tokens = np.random.default_rng(6).integers(0, vocab, (2, 12)).astype(np.int32)
    theirs = _hf_logits(hf_model, tokens)
    ours = np.asarray(model.logits(tokens))
    assert np.abs(theirs).max() > 1.0
    assert np.abs(ours - theirs).max() <= TOL
    # Round trip: our own loader reads back the same model.
    again = load_hf(tmp_path)
    assert again.config == config
    np.testing.assert_array_equal(np.asarray(again.logits(tokens)), ours)


def test_tokenizer_round_trips_through_transformers(tmp_path):
    config = ModelConfig(
        vocab_size=char_tokenizer().get_vocab_size(),
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=2,
        intermediate_size=32,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    save_hf(tmp_path, Model.init(config, key=jax.random.key(0), tokenizer=char_tokenizer()))
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = "037+085=122"
    ours = load_hf(tmp_path).tokenizer.encode(text).ids
    assert hf_tok(text, add_special_tokens=False)["input_ids"] == ours
    assert hf_tok.decode(ours) == text
    assert hf_tok.eos_token_id == 2 and hf_tok.pad_token_id == 0
    assert json.loads((tmp_path / "config.json").read_text())["eos_token_id"] == 2


def test_missing_and_unsupported_checkpoints_are_named(tmp_path):
    with pytest.raises(UsageError, match="is not a directory"):
        load_hf(tmp_path / "absent")
    with pytest.raises(UsageError, match="missing config.json"):
        load_hf(tmp_path)
    hf_model = _hf_model("llama_gqa_untied_theta")
    hf_model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(
        UsageError, match="model_type 'gpt2' is not supported; accepted: llama, mistral, qwen2, qwen3"
    ):
        load_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(UsageError, match=r"missing weights model\.layers\.2\."):
        load_hf(tmp_path)
    yarn = {**config, "rope_parameters": {"rope_type": "yarn", "factor": 2.0}}
    (tmp_path / "config.json").write_text(json.dumps(yarn))
    with pytest.raises(UsageError, match="rope scaling type 'yarn' is not supported"):
        load_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(UsageError, match="no weights found; expected model.safetensors"):
        load_hf(tmp_path)


def test_sliding_window_shorter_than_the_sequences_is_refused(tmp_path):
    hf_model = _hf_model("mistral_gqa_window_head_dim")
    hf_model.save_pretrained(tmp_path)
    config = load_hf(tmp_path).config
    assert config.sliding_window == 16 and config.head_dim == 8
    config.check_sequence_length(16)  # up to the window, full causal attention is the same
    with pytest.raises(
        UsageError, match="sequences of 17 tokens exceed the model's sliding_window=16"
    ):
        config.check_sequence_length(17)
    # Transformers' default window when a Mistral config.json leaves the field out.
    saved = json.loads((tmp_path / "config.json").read_text())
    del saved["sliding_window"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert load_hf(tmp_path).config.sliding_window == 4096


def test_inconsistent_architecture_variants_are_refused():
    base = dict(
        vocab_size=16, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=32
    )
    for arch, kwargs, message in [
        ("qwen3", {}, "qwen3 with qk_norm=False: only qwen3 has"),
        ("llama", dict(qk_norm=True), "llama with qk_norm=True: only qwen3 has"),
        ("mistral", dict(qkv_bias=True, o_bias=True), "mistral has no attention biases"),
        ("qwen2", dict(qkv_bias=True, sliding_window=8), "qwen2 with sliding_window=8"),
    ]:
        config = ModelConfig(architecture=arch, **base, **kwargs)
        with pytest.raises(UsageError, match=message):
            config_to_hf(config)
    with pytest.raises(UsageError, match="sliding_window=0: must be a positive integer or None"):
        ModelConfig(architecture="mistral", sliding_window=0, **base)
