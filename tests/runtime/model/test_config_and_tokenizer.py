"""Model config validation, the built-in tokenizer and the ``Model`` object."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from runtime.errors import UsageError
from runtime.model import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Model,
    ModelConfig,
    char_tokenizer,
    special_token_ids,
)

BASE = dict(
    vocab_size=50, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64
)


def test_defaults_and_derived_values():
    config = ModelConfig(**BASE)
    assert config.head_dim == 8 and config.attention_scale == 8**-0.5
    assert config.dtype == config.param_dtype == "float32"
    assert hash(config) == hash(ModelConfig(**BASE))  # usable as a static jit argument
    assert ModelConfig(**BASE, eos_token_id=[2, 7]).eos_token_ids == (2, 7)
    assert ModelConfig(**BASE).eos_token_ids == ()


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(num_kv_heads=3), "num_heads=4 is not a multiple of num_kv_heads=3"),
        (dict(hidden_size=30), "hidden_size=30 is not a multiple of num_heads=4"),
        (dict(num_layers=0), "num_layers=0: must be a positive integer"),
        (dict(architecture="gpt2"), "architecture='gpt2': accepted: llama, mistral, qwen2, qwen3"),
        (dict(dtype="float16"), "dtype='float16': accepted: float32, bfloat16"),
        (dict(eos_token_id=50), r"eos_token_id=50: token ids must be in \[0, 50\)"),
        (dict(head_dim=7), "head_dim=7: must be a positive even integer"),
    ],
)
def test_bad_values_are_named(change, message):
    with pytest.raises(UsageError, match=message):
        ModelConfig(**{**BASE, **change})


def test_char_tokenizer_ids_round_trip_and_unknowns():
    tok = char_tokenizer()
    assert (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)
    assert special_token_ids(tok) == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    ids = tok.encode("037+085=").ids
    # Digits follow the four special tokens: '0' -> 4, '3' -> 7, '7' -> 11.
    assert ids[:3] == [4, 7, 11] and len(ids) == 8
    for text in ("037+085=122", "f(x)=2*x+3;", "lambda x: x % 7"):
        assert tok.decode(tok.encode(text).ids) == text
    assert tok.encode("A").ids == [UNK_ID]
    assert tok.decode([BOS_ID, 5, EOS_ID, PAD_ID]) == "1"  # specials are skipped when decoding
    small = char_tokenizer("ab")
    assert small.get_vocab_size() == 6 and small.encode("ba").ids == [5, 4]
    with pytest.raises(UsageError, match=r"repeats characters \['a'\]"):
        char_tokenizer("aba")


@pytest.mark.slow
def test_model_object_from_config_and_params():
    config = ModelConfig(**BASE, tie_word_embeddings=True)
    model = Model.init(config, key=jax.random.key(0), tokenizer=char_tokenizer())
    assert "lm_head" not in model.params
    # embedding 50*32 + per layer: 2 norms 2*32, q 32*32, k,v 2*(32*16), o 32*32,
    # mlp 3*32*64 + final norm 32
    assert model.num_params == 50 * 32 + 2 * 32 + 32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 64 + 32
    logits = model.logits([[1, 2, 3]])
    assert logits.shape == (1, 3, 50) and logits.dtype == np.float32
    same = Model(config, model.params)
    np.testing.assert_array_equal(np.asarray(same.logits([[1, 2, 3]])), np.asarray(logits))
    with pytest.raises(ValueError, match=r"tokens must be \[batch, time\]"):
        model.logits([1, 2, 3])
