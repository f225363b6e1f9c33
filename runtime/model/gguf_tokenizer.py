"""The tokenizer a GGUF file describes, rebuilt as a ``tokenizers.Tokenizer`` (``tokenizer.json``).

A GGUF carries no ``tokenizer.json``: it stores the tokenizer as metadata under llama.cpp's key
names: the model (``tokenizer.ggml.model``), the vocabulary in id order, the BPE merges, each
token's type (normal, control, user-defined, ...), the name of the rule that splits text before
BPE (``tokenizer.ggml.pre``), the special token ids and the chat template.

Byte-level BPE (model ``gpt2``: GPT-2, SmolLM, StarCoder, Llama 3, Qwen2/3) is rebuilt. Text is
split as llama.cpp splits it for the named rule, which llama.cpp chose to reproduce the
checkpoint's own Hugging Face tokenizer; an unknown rule is refused rather than guessed at. For
``smollm`` that is each digit on its own before GPT-2's split: the vocabulary has no multi-digit
token, but a run of blanks before a digit stays one piece. Control tokens (and the special
tokens the ids name) become special added tokens, user-defined ones (``<think>``) plain added
tokens, so that each is matched whole in text. SentencePiece vocabularies (model ``llama``) are
refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from runtime.errors import UsageError
from runtime.model.gguf_read import BoundedReader, integers, scalar, strings

_GPT2 = "gpt2"
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp's token types
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclasses.dataclass(frozen=True)
class Split:
    """How text is cut before BPE, for one ``tokenizer.ggml.pre`` name.

    Attributes:
      regex: the split regex, or None for GPT-2's (``ByteLevel``'s own).
      digits: each digit is its own piece first.
      nfc: text is NFC-normalized first (Qwen2's own tokenizer does).
      ignore_merges: a piece that is itself a token is taken whole (Llama 3's tokenizer does).
    """

    regex: str | None = None
    digits: bool = False
    nfc: bool = False
    ignore_merges: bool = False


SPLITS = {
    "default": Split(),
    "gpt2": Split(),
    "smollm": Split(digits=True),
    "starcoder": Split(digits=True),
    "refact": Split(digits=True),
    "llama-bpe": Split(_LLAMA3_SPLIT, ignore_merges=True),
    "llama3": Split(_LLAMA3_SPLIT, ignore_merges=True),
    "qwen2": Split(_QWEN2_SPLIT, nfc=True),
    "deepseek-r1-qwen": Split(_QWEN2_SPLIT, nfc=True),
}
SPECIAL_IDS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
               "pad_token": "padding_token_id"}


@dataclasses.dataclass(frozen=True, eq=False)
class GgufText:
    """The text side of a GGUF checkpoint.

    Attributes:
      tokenizer: the rebuilt tokenizer.
      special_tokens: ``bos_token``, ``eos_token``, ``unk_token``, ``pad_token`` strings (those named).
      special_ids: the same as ids.
      end_ids: every id that ends a completion: the end-of-sequence, end-of-turn and end-of-message ids.
      add_bos: whether a prompt starts with the BOS token (``tokenizer.ggml.add_bos_token``).
      chat_template: ``tokenizer.chat_template``, or None.
    """

    tokenizer: Tokenizer
    special_tokens: dict[str, str]
    special_ids: dict[str, int]
    end_ids: tuple[int, ...]
    add_bos: bool
    chat_template: str | None


def _byte_spelling(token: str, alphabet: frozenset[str]) -> str:
    """``token`` in the byte-level alphabet (a vocabulary entry written as plain text is respelled
    byte by byte, as the BPE model sees text)."""
    if set(token) <= alphabet:
        return token
    spell = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return "".join(piece for piece, _ in spell.pre_tokenize_str(token))


def _pre_tokenizer(split: Split) -> Any:
    steps: list[Any] = []
    if split.digits:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    if split.regex is not None:
        steps.append(pre_tokenizers.Split(Regex(split.regex), behavior="isolated"))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=split.regex is None))
    return steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)


def gguf_text(reader: BoundedReader, vocab_size: int) -> GgufText:
    """The tokenizer, special tokens and chat template of a GGUF file.

    Args:
      reader: the open file.
      vocab_size: the model's vocabulary (rows of its embedding); the tokenizer may not name more.

    Raises:
      UsageError: the tokenizer is not byte-level BPE, its split rule is unknown, or its
        vocabulary, merges, types or special ids are missing or inconsistent.
    """
    where = reader.path
    kind = scalar(reader, "tokenizer.ggml.model", str)
    if kind != _GPT2:
        extra = " (SentencePiece)" if kind == "llama" else ""
        raise UsageError(f"{where}: tokenizer.ggml.model {kind!r}{extra} is not supported; accepted: "
                         f"{_GPT2!r} (byte-level BPE)")
    pre = scalar(reader, "tokenizer.ggml.pre", str, "default")
    if pre not in SPLITS:
        raise UsageError(f"{where}: tokenizer.ggml.pre {pre!r} (how text is split before BPE) is not supported; "
                         f"accepted: {', '.join(sorted(SPLITS))}")
    split = SPLITS[pre]
    tokens = strings(reader, "tokenizer.ggml.tokens")
    merges = strings(reader, "tokenizer.ggml.merges")
    if not tokens or merges is None:
        raise UsageError(f"{where}: the tokenizer's vocabulary or merges are missing "
                         "(tokenizer.ggml.tokens, tokenizer.ggml.merges)")
    if len(tokens) > vocab_size:
        raise UsageError(f"{where}: the tokenizer has {len(tokens):,} tokens, more than the model's "
                         f"{vocab_size:,} embedding rows")
    types = integers(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise UsageError(f"{where}: tokenizer.ggml.token_type has {len(types):,} entries for {len(tokens):,} tokens")
    special_ids: dict[str, int] = {}
    for name, key in SPECIAL_IDS.items():
        value = scalar(reader, f"tokenizer.ggml.{key}", int)
        if value is not None:
            if not 0 <= value < len(tokens):
                raise UsageError(f"{where}: tokenizer.ggml.{key}={value} is not a token id in [0, {len(tokens)})")
            special_ids[name] = value
    ends = [special_ids.get("eos_token")]
    for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        value = scalar(reader, key, int)
        if value is not None and not 0 <= value < len(tokens):
            raise UsageError(f"{where}: {key}={value} is not a token id in [0, {len(tokens)})")
        ends.append(value)
    named = set(special_ids.values())

    alphabet = frozenset(pre_tokenizers.ByteLevel.alphabet())
    added = [(i, t) for i, (t, k) in enumerate(zip(tokens, types, strict=True))
             if k in (_CONTROL, _USER_DEFINED) or i in named]
    kept_whole = {i for i, _ in added}
    vocab = {(t if i in kept_whole else _byte_spelling(t, alphabet)): i for i, t in enumerate(tokens)}
    pairs: list[tuple[str, str]] = []
    for merge in merges:
        left, space, right = merge.partition(" ")
        if not (left and space and right) or " " in right:
            raise UsageError(f"{where}: tokenizer.ggml.merges entry {merge[:80]!r} is not two tokens separated by "
                             "a space")
        pairs.append((left, right))
    try:
        tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False,
                                         ignore_merges=split.ignore_merges))
    except Exception as e:  # the tokenizers library raises plain Exceptions for an inconsistent vocabulary
        raise UsageError(f"{where}: the tokenizer cannot be built: {' '.join(str(e).split())[:300]}") from None
    if split.nfc:
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = _pre_tokenizer(split)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for i, t in added if types[i] == _CONTROL or i in named])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for i, t in added if types[i] == _USER_DEFINED and i not in named])
    add_bos = bool(scalar(reader, "tokenizer.ggml.add_bos_token", bool, False))
    special_tokens = {name: tokens[i] for name, i in special_ids.items()}
    if add_bos:
        if "bos_token" not in special_tokens:
            raise UsageError(f"{where}: tokenizer.ggml.add_bos_token is true but no tokenizer.ggml.bos_token_id "
                             "names the token")
        bos = special_tokens["bos_token"]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, special_ids["bos_token"])])
    return GgufText(tokenizer, special_tokens, special_ids, tuple(dict.fromkeys(i for i in ends if i is not None)),
                    add_bos, scalar(reader, "tokenizer.chat_template", str))


__all__ = ["SPLITS", "GgufText", "Split", "gguf_text"]
