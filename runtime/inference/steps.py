"""The engine's two device programs: prefill one request into a slot, and one decode step.

Both are pure functions, compiled ahead of time by the engine for fixed shapes:

- ``prefill_into_slot``: ``[1, bucket]`` prompt tokens -> KV cache pages of the prompt, and the
  logits of the first generated token written into row ``slot`` of the slot logits ``[S, V]``.
  One program per bucket; the slot index is traced, so every slot shares it.
- ``decode_step``: for all ``S`` slots at once, draw a token from each slot's logits (or take the
  forced token of a slot that replays tokens it generated before a preemption), then run the
  decoder on those tokens, writing their keys/values and producing the next logits.

A slot's results depend only on that slot's inputs: the decoder, the sampler and the log-prob are
row-wise at a fixed ``[S, ...]`` shape, and a prefill always runs one request at its bucket's
fixed shape. This is what makes a request's tokens and log-prob bits independent of the batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.logprobs import token_logprobs
from runtime.inference.sampling import sample
from runtime.model import KVCache, ModelConfig, decode, prefill


def prefill_into_slot(
    params: dict,
    tokens_1T: jax.Array,
    length_1: jax.Array,
    page_row_1P: jax.Array,
    slot: jax.Array,
    cache: KVCache,
    logits_SV: jax.Array,
    *,
    config: ModelConfig,
) -> tuple[KVCache, jax.Array]:
    """Prefill one prompt and put its next-token logits in row ``slot``.

    DONATES cache, logits_SV.

    Args:
      tokens_1T: the prompt, right-padded to the bucket length ``T``.
      length_1: int32 prompt length.
      page_row_1P: the request's page-table row (pages for at least ``length`` tokens).
      slot: int32 scalar, the decode slot the request takes.

    Returns:
      ``(cache, logits_SV)`` with the prompt's keys/values written and row ``slot`` replaced.
    """
    logits_1V, cache = prefill(params, tokens_1T, length_1, cache, page_row_1P, config=config)
    logits_SV = jax.lax.dynamic_update_slice(logits_SV, logits_1V, (slot, jnp.int32(0)))
    return cache, logits_SV


def decode_step(
    params: dict,
    cache: KVCache,
    logits_SV: jax.Array,
    page_table_SP: jax.Array,
    positions_S: jax.Array,
    forced_S: jax.Array,
    key_data_S2: jax.Array,
    index_S: jax.Array,
    temperature_S: jax.Array,
    top_k_S: jax.Array,
    top_p_S: jax.Array,
    *,
    config: ModelConfig,
    attention_impl: str = "reference",
) -> tuple[KVCache, jax.Array, jax.Array, jax.Array]:
    """Draw the next token of every slot and feed it through the decoder.

    DONATES cache, logits_SV.

    Args:
      logits_SV: float32 each slot's next-token logits (from a prefill or the previous step).
      page_table_SP: int32 page table, one fixed-width row per slot.
      positions_S: int32 position the drawn token takes (tokens already cached); -1 = empty slot.
      forced_S: int32 token to take instead of drawing one (a replay after preemption), or -1.
      key_data_S2, index_S, temperature_S, top_k_S, top_p_S: the sampler's inputs per slot
        (``sampling.sample``).

    Returns:
      ``(cache, logits_SV, tokens_S, logprobs_S)``: the tokens taken, their log-probs
      (``token_logprobs`` at the slot's temperature), and the logits of the token after them.
    """
    drawn_S, _ = sample(logits_SV, key_data_S2, index_S, temperature_S, top_k_S, top_p_S)
    tokens_S = jnp.where(forced_S >= 0, forced_S, drawn_S).astype(jnp.int32)
    logprobs_S = token_logprobs(logits_SV, tokens_S, temperature_S)
    logits_SV, cache = decode(
        params, tokens_S, positions_S, cache, page_table_SP, config=config,
        attention_impl=attention_impl,
    )
    return cache, logits_SV, tokens_S, logprobs_S
