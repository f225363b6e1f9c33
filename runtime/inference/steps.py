"""The engine's device programs: prefill prompts into their slots, and decode steps.

All are pure functions; the engine compiles ``prefill_into_slots`` and ``decode_steps`` ahead
of time for fixed shapes:

- ``prefill_into_slots``: ``[R, bucket]`` prompt tokens (``R`` fixed per bucket, unused rows
  empty) -> KV cache pages of the prompts, and the logits of each one's first
  generated token written into its slot's row of the slot logits ``[S, V]`` and of the prompt
  logits ``[S, V]`` (which keep them while decoding moves the slot's row on). One program per
  bucket; slot indices are traced, so every slot shares it.
- ``copy_prompts``: a prompt's partially filled last page and first-token logits, given to a
  request of the same prompt instead of its own prefill.
- ``decode_step``: for all ``S`` slots at once, draw a token from each slot's logits (or take the
  forced token of a slot that replays tokens it generated before a preemption), then run the
  decoder on those tokens, writing their keys/values and producing the next logits.
- ``decode_steps``: up to ``N`` decode steps in one call (a loop over ``decode_step``), so that
  the host is visited once per ``N`` tokens rather than once per token. Every token is produced by
  the same loop body, whichever iteration it falls in and however many iterations a call runs.

A slot's results depend only on that slot's inputs: the decoder, the sampler and the log-prob are
row-wise at a fixed ``[S, ...]`` shape, and a prompt is always prefilled at its bucket's fixed
``[R, bucket]`` shape, whatever the other rows hold. This is what makes a request's tokens and
log-prob bits independent of the batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.logprobs import exact_token_logprobs, token_logprobs
from runtime.inference.sampling import sample
from runtime.model import KVCache, ModelConfig, decode, prefill
from runtime.model.transformer import exact_rows
from runtime.numerics import pad_rows, padded_rows


def prefill_into_slots(
    params: dict,
    tokens_RT: jax.Array,
    lengths_R: jax.Array,
    page_rows_RP: jax.Array,
    slots_R: jax.Array,
    cache: KVCache,
    logits_SV: jax.Array,
    firsts_SV: jax.Array,
    *,
    config: ModelConfig,
    exact_block: int = 0,
) -> tuple[KVCache, jax.Array, jax.Array]:
    """Prefill ``R`` prompts and put each one's next-token logits in its slot's row, of the slot
    logits and of the prompt logits ``firsts_SV``.

    DONATES cache, logits_SV, firsts_SV.

    Args:
      tokens_RT: prompts right-padded to the bucket length ``T``.
      lengths_R: int32 prompt lengths; 0 marks an unused row, which writes nothing.
      page_rows_RP: each request's page-table row (pages for at least ``length`` tokens).
      slots_R: int32 the decode slot each request takes; ``S`` (out of range) for unused rows.
      exact_block: > 0, the exact mode with pages of this many tokens (``model.prefill``).

    Returns:
      ``(cache, logits_SV, firsts_SV)`` with the prompts' keys/values written and their slots'
      rows replaced.
    """
    logits_RV, cache = prefill(params, tokens_RT, lengths_R, cache, page_rows_RP, config=config,
                               exact_block=exact_block)
    def put(rows_SV):
        return rows_SV.at[slots_R].set(logits_RV, mode="drop")

    return cache, put(logits_SV), put(firsts_SV)


def copy_prompts(
    cache: KVCache,
    logits_SV: jax.Array,
    firsts_SV: jax.Array,
    from_pages_R: jax.Array,
    to_pages_R: jax.Array,
    from_slots_R: jax.Array,
    to_slots_R: jax.Array,
) -> tuple[KVCache, jax.Array]:
    """Give ``R`` admitted requests the prefill of an identical prompt a running one had.

    DONATES cache, logits_SV.

    Row ``r`` copies page ``from_pages_R[r]`` (a prefilled request's last, partially filled prompt
    page; the full ones are shared, not copied) onto page ``to_pages_R[r]`` (the new request's)
    and the prompt logits of slot ``from_slots_R[r]`` (``firsts_SV``, the prefilled request's
    slot) onto slot ``to_slots_R[r]`` of ``logits_SV``. The prefilled request may have
    decoded since: its tokens past the prompt sit in slots of the copied page that the new request
    never reads and overwrites with its own. Unused entries copy the null page onto itself and
    name slot ``S`` (out of range), which writes nothing. The copies are the bits the new
    request's own prefill would have written: the same prompt through the same compiled prefill.
    """
    def copy(pages):  # [K, N, page, D]
        return pages.at[:, to_pages_R].set(pages[:, from_pages_R])

    cache = KVCache(tuple(map(copy, cache.k_pages)), tuple(map(copy, cache.v_pages)))
    rows_RV = firsts_SV.at[from_slots_R].get(mode="fill", fill_value=0.0)
    return cache, logits_SV.at[to_slots_R].set(rows_RV, mode="drop")


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
    if attention_impl == "ordered":  # the exact mode: the log-softmax over as many rows as the trainer's
        S = tokens_S.shape[0]
        rows = padded_rows(S, least=exact_rows(config))
        logprobs_S = exact_token_logprobs(
            pad_rows(logits_SV, rows), pad_rows(tokens_S, rows), pad_rows(temperature_S, rows, 1.0)
        )[:S]
    else:
        logprobs_S = token_logprobs(logits_SV, tokens_S, temperature_S)
    logits_SV, cache = decode(
        params, tokens_S, positions_S, cache, page_table_SP, config=config,
        attention_impl=attention_impl,
    )
    return cache, logits_SV, tokens_S, logprobs_S


def decode_steps(
    params: dict,
    cache: KVCache,
    logits_SV: jax.Array,
    page_table_SP: jax.Array,
    positions_S: jax.Array,
    takes_S: jax.Array,
    forced_SN: jax.Array,
    key_data_S2: jax.Array,
    index_S: jax.Array,
    temperature_S: jax.Array,
    top_k_S: jax.Array,
    top_p_S: jax.Array,
    num_steps: jax.Array,
    *,
    config: ModelConfig,
    attention_impl: str = "reference",
) -> tuple[KVCache, jax.Array, jax.Array, jax.Array]:
    """Run ``num_steps`` (at most ``N``) decode steps; iteration ``i`` is ``decode_step`` at ``+ i``.

    DONATES cache, logits_SV.

    Args:
      positions_S: int32 position of each slot's first token of the call; -1 = empty slot.
      takes_S: int32 tokens each slot takes in this call (``<= num_steps``); in iterations
        ``i >= takes_S`` the slot is empty: it writes nothing and its logits row becomes
        meaningless, so only a request that ends within the call may take fewer tokens.
      forced_SN: int32 token to take at iteration ``i`` instead of drawing one, or -1.
      index_S: int32 index of each slot's first token of the call among its request's
        generated tokens (the sampler's key index; iteration ``i`` uses ``index_S + i``).
      num_steps: int32 scalar, iterations to run, in ``[0, N]``; traced, so one compiled program
        serves every count.

    Returns:
      ``(cache, logits_SV, tokens_NS, logprobs_NS)``: row ``i`` holds iteration ``i``'s tokens and
      log-probs (rows ``>= num_steps`` and entries of empty slots are meaningless).
    """
    N = forced_SN.shape[1]
    S = positions_S.shape[0]

    def body(i, carry):
        cache, logits_SV, tokens_NS, logprobs_NS = carry
        active_S = i < takes_S
        cache, logits_SV, tokens_S, logprobs_S = decode_step(
            params, cache, logits_SV, page_table_SP,
            jnp.where(active_S & (positions_S >= 0), positions_S + i, -1),
            jax.lax.dynamic_index_in_dim(forced_SN, i, axis=1, keepdims=False),
            key_data_S2, index_S + i, temperature_S, top_k_S, top_p_S,
            config=config, attention_impl=attention_impl,
        )
        tokens_NS = jax.lax.dynamic_update_index_in_dim(tokens_NS, tokens_S, i, axis=0)
        logprobs_NS = jax.lax.dynamic_update_index_in_dim(logprobs_NS, logprobs_S, i, axis=0)
        return cache, logits_SV, tokens_NS, logprobs_NS

    init = (cache, logits_SV, jnp.zeros((N, S), jnp.int32), jnp.zeros((N, S), jnp.float32))
    return jax.lax.fori_loop(0, num_steps, body, init)
