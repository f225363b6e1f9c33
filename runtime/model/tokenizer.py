"""The built-in character-level tokenizer of the synthetic tasks.

One token per character, built with the ``tokenizers`` library (a BPE model with no merges and a
fusing decoder), so it saves as a standard ``tokenizer.json`` that Hugging Face loads. Ids are
stable: the special tokens first, then the alphabet in the given order.
"""

from __future__ import annotations

import json
import string

from tokenizers import Tokenizer, decoders, models

from runtime.errors import UsageError

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)

# Arithmetic and small Python expressions/functions: `037+085=`, `f(x)=2*x+3;`, `lambda x: x%7`.
DEFAULT_ALPHABET = string.digits + string.ascii_lowercase + " +-*/%=()<>,.:;[]_'\"!?\n"


def char_tokenizer(alphabet: str = DEFAULT_ALPHABET) -> Tokenizer:
    """A tokenizer with ids ``<pad>=0, <bos>=1, <eos>=2, <unk>=3`` then one id per character.

    Characters outside the alphabet encode to ``<unk>``. Encoding adds no special tokens: a task
    prepends ``<bos>`` / appends ``<eos>`` itself (``BOS_ID``, ``EOS_ID``).
    """
    if not alphabet:
        raise UsageError("tokenizer alphabet is empty: give at least one character")
    duplicates = sorted({c for c in alphabet if alphabet.count(c) > 1})
    if duplicates:
        raise UsageError(f"tokenizer alphabet repeats characters {duplicates!r}: list each once")
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for char in alphabet:
        vocab[char] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


def special_token_ids(tokenizer: Tokenizer) -> dict[str, int | None]:
    """``{"bos_token_id", "eos_token_id", "pad_token_id"}`` of a tokenizer (None when absent)."""
    return {
        "bos_token_id": tokenizer.token_to_id(BOS),
        "eos_token_id": tokenizer.token_to_id(EOS),
        "pad_token_id": tokenizer.token_to_id(PAD),
    }


def one_token_per_char(tokenizer: Tokenizer) -> bool:
    """Whether ``tokenizer`` encodes each character as (at most) one token: a BPE model with no
    merges, normalizer, pre-tokenizer, byte fallback or subword affixes, as ``char_tokenizer``
    builds. Then a text's characters bound its tokens (an added token may cover several)."""
    spec = json.loads(tokenizer.to_str())
    model = spec.get("model") or {}
    return (model.get("type") == "BPE" and not model.get("merges") and not model.get("byte_fallback")
            and not model.get("continuing_subword_prefix") and not model.get("end_of_word_suffix")
            and model.get("dropout") is None and spec.get("normalizer") is None
            and spec.get("pre_tokenizer") is None)
