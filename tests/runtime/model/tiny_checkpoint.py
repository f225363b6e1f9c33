"""A tiny Qwen2-architecture checkpoint written in a test: random weights, a byte-level BPE
tokenizer trained on the task's text with ``tokenizers``, a Qwen-style chat template in
``tokenizer_config.json`` and a ``generation_config.json`` with two end-of-sequence ids
(end-of-turn first, as ``config.json`` names it, then end-of-text)."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterable
from typing import Any

import jax
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from runtime.model import Model, ModelConfig, save_hf

END_OF_TEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
# Qwen2.5's template, shortened (no tool calls), keeping its whitespace control, its default
# system message and a ``tojson`` filter, which the Jinja environment must configure as
# Transformers does.
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "    {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- if tools %}\n"
    "    {{- '<tools>' + (tools | tojson) + '</tools>' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if message.role != 'system' or not loop.first %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)
# Qwen2's pre-tokenizer split: one digit per piece, words with their leading space.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SHAPE: dict[str, Any] = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)


def bpe_tokenizer(texts: Iterable[str], vocab_size: int = 400) -> Tokenizer:
    """A byte-level BPE tokenizer built as Qwen2's (NFC, its split, byte-level pieces) trained on
    ``texts``, with Qwen's special tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[END_OF_TEXT, IM_START, IM_END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(list(texts), trainer)
    return tokenizer


def write_checkpoint(directory, texts: Iterable[str], *, architecture: str = "qwen2", chat_template: bool = True,
                     seed: int = 0) -> Model:
    """Write a tiny checkpoint of ``architecture`` (``qwen2`` or ``llama``) into ``directory``."""
    texts = list(texts)
    tokenizer = bpe_tokenizer([*texts, "You are a helpful assistant. system user assistant"])
    end_of_text, im_end = tokenizer.token_to_id(END_OF_TEXT), tokenizer.token_to_id(IM_END)
    config = ModelConfig(vocab_size=tokenizer.get_vocab_size(), **SHAPE, max_position_embeddings=256,
                         architecture=architecture, qkv_bias=architecture == "qwen2",
                         bos_token_id=end_of_text, eos_token_id=im_end)  # Qwen2 names a BOS it never adds
    model = Model.init(config, key=jax.random.key(seed), tokenizer=tokenizer)
    save_hf(directory, model)
    root = pathlib.Path(directory)
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": IM_END,
                        "pad_token": END_OF_TEXT, "model_max_length": 256}
    if architecture != "qwen2":
        tokenizer_config["bos_token"] = END_OF_TEXT
    if chat_template:
        tokenizer_config["chat_template"] = CHAT_TEMPLATE
    (root / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    generation = {"bos_token_id": end_of_text, "eos_token_id": [im_end, end_of_text]}
    (root / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    return model
