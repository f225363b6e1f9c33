"""Tiny GGUF checkpoints written as llama.cpp's converter writes them, for the import tests.

``write_gguf`` takes random weights in Hugging Face layout, permutes the q/k rows of a Llama
model as ``convert_hf_to_gguf`` does, quantizes some tensors (Q8_0, Q4_1, F16) and stores a
byte-level BPE tokenizer trained with ``tokenizers`` (Qwen2-style unless another is given) with
ChatML's special tokens and a chat template; it returns the weights the import should give back.
``family_tokenizer`` builds the tokenizer of the family llama.cpp names by a ``tokenizer.ggml.pre``
value, from that family's own ``tokenizer.json`` layout.
"""

from __future__ import annotations

import json
import pathlib

import gguf
import numpy as np
from gguf.quants import quant_shape_to_byte_shape

from runtime.model.gguf_read import SUPPORTED_TYPES
from tests.runtime.model.tiny_checkpoint import END_OF_TEXT, IM_END, IM_START, QWEN2_SPLIT, bpe_tokenizer

PIECES = ["0", "7", "42", "2024", "3.14", "-5", " ", "  ", "   ", "\n", "\n\n", "\t", "hello", "Hello", " world", "The",
          "don't", "it's", "café", "naïve", "日本語", "こんにちは", "Привет", "😀", "👍🏽", "ß", "½", "²", "ﬁ", IM_START,
          IM_END, END_OF_TEXT, "user", "assistant", "system", "!", "?", ",", ".", "(", ")", "{", "}", "#", "$", "%",
          "&", "*", "+", "=", "_", "-", "/", "\\", "'", '"', "<", ">", "|", "def", "return", "x", "é"]


def generated_strings(n: int, seed: int) -> list[str]:
    """``n`` strings of 1-11 pieces: digits, blanks, newlines, letters of several scripts, emoji,
    punctuation and the chat template's special tokens."""
    rng = np.random.default_rng(seed)
    return ["".join(PIECES[j] for j in rng.integers(0, len(PIECES), rng.integers(1, 12))) for _ in range(n)]


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf's ``LlamaModel.permute``: each head's rows as ``[2, head_dim / 2]``,
    axes swapped (the halves interleaved into pairs)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


SHAPES = {
    "llama": dict(hidden=64, heads=4, kv_heads=2, head_dim=16, inter=96, layers=2),
    "qwen2": dict(hidden=64, heads=4, kv_heads=2, head_dim=16, inter=96, layers=2),
    "qwen3": dict(hidden=64, heads=2, kv_heads=1, head_dim=128, inter=96, layers=2),  # head_dim != hidden / heads
}
QUANTIZED = {"mlp.gate_proj.weight": gguf.GGMLQuantizationType.Q8_0, "mlp.down_proj.weight": gguf.GGMLQuantizationType.Q4_1,
             "self_attn.v_proj.weight": gguf.GGMLQuantizationType.F16}
GGUF_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight"}
LAYER_NAMES = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
               "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
               "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
               "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
               "self_attn.v_proj.bias": "attn_v.bias", "self_attn.q_norm.weight": "attn_q_norm.weight",
               "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
               "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
TEXTS = ["What is 3 plus 4?", "The answer is 7.", "hello world", "Hello, world! 12 + 30 = 42", "café naïve 日本"]


def hf_weights(arch: str, vocab: int, *, tied: bool, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights in Hugging Face layout (std 0.2, norm scales around 1, so that a wrong
    rotary order shows far above the tolerance)."""
    s = SHAPES[arch]
    rng = np.random.default_rng(seed)

    def rand(*shape: int, mean: float = 0.0) -> np.ndarray:
        return (mean + 0.2 * rng.standard_normal(shape)).astype(np.float32)

    q, kv = s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    w = {"model.embed_tokens.weight": rand(vocab, s["hidden"]), "model.norm.weight": rand(s["hidden"], mean=1)}
    if not tied:
        w["lm_head.weight"] = rand(vocab, s["hidden"])
    for i in range(s["layers"]):
        p = f"model.layers.{i}."
        w |= {p + "input_layernorm.weight": rand(s["hidden"], mean=1),
              p + "post_attention_layernorm.weight": rand(s["hidden"], mean=1),
              p + "self_attn.q_proj.weight": rand(q, s["hidden"]), p + "self_attn.k_proj.weight": rand(kv, s["hidden"]),
              p + "self_attn.v_proj.weight": rand(kv, s["hidden"]), p + "self_attn.o_proj.weight": rand(s["hidden"], q),
              p + "mlp.gate_proj.weight": rand(s["inter"], s["hidden"]), p + "mlp.up_proj.weight": rand(s["inter"], s["hidden"]),
              p + "mlp.down_proj.weight": rand(s["hidden"], s["inter"])}
        if arch == "qwen2":
            w |= {p + "self_attn.q_proj.bias": rand(q), p + "self_attn.k_proj.bias": rand(kv),
                  p + "self_attn.v_proj.bias": rand(kv)}
        if arch == "qwen3":
            w |= {p + "self_attn.q_norm.weight": rand(s["head_dim"], mean=1),
                  p + "self_attn.k_norm.weight": rand(s["head_dim"], mean=1)}
    return w


def gguf_name(hf: str) -> str:
    if hf in GGUF_NAMES:
        return GGUF_NAMES[hf]
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{LAYER_NAMES[rest]}"


def write_gguf(path: pathlib.Path, arch: str = "llama", *, tied: bool = False, seed: int = 0,
               metadata: dict | None = None, tensor_types: dict | None = None,
               drop: tuple[str, ...] = (), tokenizer=None) -> dict[str, np.ndarray]:
    """A tiny GGUF checkpoint as llama.cpp's converter writes one; returns the weights as the
    import should give them back (Hugging Face layout, after the round trip of any quantization).

    ``metadata`` overrides or adds keys (a value None removes one); ``tensor_types`` maps a
    Hugging Face tensor-name suffix to a GGML type; ``drop`` leaves tensors out; ``tokenizer``
    replaces the Qwen2-style one trained on ``TEXTS``."""
    tokenizer = tokenizer or bpe_tokenizer(TEXTS, vocab_size=300)
    model = json.loads(tokenizer.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    s = SHAPES[arch]
    weights = hf_weights(arch, len(tokens), tied=tied, seed=seed)
    types = QUANTIZED if tensor_types is None else tensor_types
    keys: dict = {
        f"{arch}.context_length": 256, f"{arch}.embedding_length": s["hidden"], f"{arch}.block_count": s["layers"],
        f"{arch}.feed_forward_length": s["inter"], f"{arch}.attention.head_count": s["heads"],
        f"{arch}.attention.head_count_kv": s["kv_heads"], f"{arch}.rope.freq_base": 500.0,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-5, f"{arch}.attention.key_length": s["head_dim"],
        f"{arch}.attention.value_length": s["head_dim"], f"{arch}.rope.dimension_count": s["head_dim"],
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3 if t in (END_OF_TEXT, IM_START, IM_END) else 1 for t in tokens],
        "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": tokens.index(IM_START),
        "tokenizer.ggml.eos_token_id": tokens.index(IM_END), "tokenizer.ggml.padding_token_id": tokens.index(IM_END),
        "tokenizer.ggml.add_bos_token": False, "tokenizer.chat_template": TEMPLATE,
    }
    keys |= metadata or {}
    writer = gguf.GGUFWriter(str(path), keys.pop("general.architecture", arch))  # it names its architecture
    for key, value in keys.items():
        if value is None:
            continue
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_array(key, value)
    expected = {}
    for name, value in weights.items():
        if gguf_name(name) in drop:
            continue
        if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            stored = llama_cpp_permute(value, s["heads"] if ".q_proj." in name else s["kv_heads"])
        else:
            stored = value
        qtype = next((t for suffix, t in types.items() if name.endswith(suffix)), None)
        if qtype is None:
            writer.add_tensor(gguf_name(name), stored)
            expected[name] = value
        elif qtype not in SUPPORTED_TYPES:  # no quantizer here: bytes of the right size
            data = np.random.default_rng(0).integers(0, 256, quant_shape_to_byte_shape(stored.shape, qtype), np.uint8)
            writer.add_tensor(gguf_name(name), data, raw_dtype=qtype)
        else:
            data = gguf.quants.quantize(stored, qtype)
            writer.add_tensor(gguf_name(name), data, raw_dtype=qtype)
            expected[name] = gguf.quants.quantize(value, qtype)  # quantized per row: rows permute with it
            expected[name] = gguf.quants.dequantize(expected[name], qtype).astype(np.float32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


# Llama 3's split, as its tokenizer.json spells it (up to three digits a piece).
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def family_tokenizer(pre: str):
    """A byte-level BPE built as the ``tokenizer.json`` of the family llama.cpp names ``pre``
    (trained on ``TEXTS``, with ChatML's special tokens)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    regex = {"llama-bpe": LLAMA3_SPLIT, "qwen2": QWEN2_SPLIT}.get(pre)
    tokenizer = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=regex is None)
    if pre == "smollm":
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif regex is not None:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(regex), behavior="isolated"), byte_level])
    else:
        tokenizer.pre_tokenizer = byte_level
    if pre == "qwen2":
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=[END_OF_TEXT, IM_START, IM_END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(TEXTS + generated_strings(200, seed=9), trainer)
    if pre == "llama-bpe":
        tokenizer.model.ignore_merges = True
    return tokenizer
