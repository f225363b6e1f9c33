"""``Model``: a config, its parameters and (optionally) a tokenizer, with convenience calls.

The computation lives in pure functions (``runtime.model.transformer``); a ``Model`` only binds
them to one set of weights. It is what ``load_hf`` returns and what the inference engine and the
trainer take.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from tokenizers import Tokenizer

from runtime.model import transformer
from runtime.model.config import ModelConfig


@dataclasses.dataclass(frozen=True, eq=False)
class Model:
    """A decoder with weights.

    Attributes:
      config: the ``ModelConfig`` (static under ``jit``).
      params: the flax parameter tree (no ``{"params": ...}`` wrapper), in ``config.param_dtype``.
      tokenizer: a ``tokenizers.Tokenizer`` or None.
    """

    config: ModelConfig
    params: dict
    tokenizer: Tokenizer | None = None

    @classmethod
    def init(
        cls, config: ModelConfig, *, key: jax.Array, tokenizer: Tokenizer | None = None
    ) -> Model:
        """A model with random weights (``transformer.init_params``)."""
        return cls(config, transformer.init_params(config, key=key), tokenizer)

    def with_params(self, params: dict) -> Model:
        """The same model with other weights (e.g. a newer trained version)."""
        return dataclasses.replace(self, params=params)

    @property
    def num_params(self) -> int:
        return sum(x.size for x in jax.tree_util.tree_leaves(self.params))

    def logits(self, tokens_BT, attention_mask_BT=None) -> jax.Array:
        """Float32 ``[B, T, vocab]`` logits of int ``[B, T]`` tokens (``transformer.forward``)."""
        tokens_BT = jnp.asarray(tokens_BT, jnp.int32)
        if tokens_BT.ndim != 2:
            raise ValueError(f"tokens must be [batch, time], got shape {tokens_BT.shape}")
        if attention_mask_BT is not None:
            attention_mask_BT = jnp.asarray(attention_mask_BT, bool)
        return transformer.forward(self.params, tokens_BT, attention_mask_BT, config=self.config)

    def init_cache(self, *, num_pages: int, page_size: int) -> transformer.KVCache:
        """An empty paged KV cache for this model (``transformer.init_cache``)."""
        return transformer.init_cache(self.config, num_pages=num_pages, page_size=page_size)
