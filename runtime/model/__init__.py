"""The decoder (Llama / Mistral / Qwen2 / Qwen3 family): config, parameters, forward paths, HF interop, tokenizer.

Entry points:

- ``ModelConfig``; ``Model`` (config + params + tokenizer) with ``Model.init`` and ``.logits``;
- ``load_hf(path)`` / ``save_hf(path, model)`` for Hugging Face directories;
- pure functions ``forward`` (full sequence), ``prefill`` and ``decode`` (paged KV cache) over
  ``(params, ..., config=...)``, with ``KVCache`` / ``init_cache``;
- ``char_tokenizer`` for the built-in synthetic tasks.
"""

from runtime.model.config import ModelConfig, RopeScaling
from runtime.model.hf import load_hf, save_hf
from runtime.model.model import Model
from runtime.model.tokenizer import (
    BOS_ID,
    DEFAULT_ALPHABET,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    char_tokenizer,
    special_token_ids,
)
from runtime.model.transformer import KVCache, decode, exact_forward, forward, init_cache, init_params, prefill

__all__ = [
    "BOS_ID",
    "DEFAULT_ALPHABET",
    "EOS_ID",
    "KVCache",
    "Model",
    "ModelConfig",
    "PAD_ID",
    "RopeScaling",
    "UNK_ID",
    "char_tokenizer",
    "decode",
    "exact_forward",
    "forward",
    "init_cache",
    "init_params",
    "load_hf",
    "prefill",
    "save_hf",
    "special_token_ids",
]
