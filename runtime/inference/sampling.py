"""Sampling parameters and the batch-invariant sampler.

The key of generated token ``t`` (0-based, counting generated tokens only) of a request with seed
``s`` is ``fold_in(key(s), t)``, where ``key(s)`` is the threefry key with data
``[s >> 32, s & 0xffffffff]`` (``jax.random.key(s)`` for seeds below 2**31; every one of the
64 bits counts). A token therefore depends on its request's seed
and index only, never on the batch, the slot or the step it was drawn in.

Drawing token ``t`` from float32 logits ``z`` (one row; every operation below is row-wise):

- ``temperature == 0``: greedy, ``argmax_v z_v`` (the first index on ties).
- otherwise ``u = z / T``; top-k keeps the ``k`` largest ``u``; top-p then keeps the smallest
  prefix of the remaining tokens, by decreasing probability, whose probability mass reaches ``p``
  (Holtzman et al., 2020), computed over the top-k distribution; a token tied with the last one
  kept is kept too. The token is ``argmax_v (u_v + g_v)`` over the kept tokens, with ``g`` standard
  Gumbel noise from the token's key (the Gumbel-max trick: an exact draw from the renormalised
  truncated distribution).

The log-prob recorded for a token is ``kernels.logprobs.token_logprobs(z, token, T)``:
``log softmax(z / T)`` of the full vocabulary, *before* top-k / top-p truncation, with ``T = 1``
for greedy rows. It is the value the trainer recomputes from its own forward pass.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernels.logprobs import token_logprobs
from runtime.errors import UsageError

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
SEED_LIMIT = 2**64
# Below this, logits / T can overflow float32; a temperature that low is greedy in all but name.
MIN_TEMPERATURE = 1e-4


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded.

    Attributes:
      temperature: ``0.0`` means greedy; otherwise the logits are divided by it (at least
        ``MIN_TEMPERATURE``).
      top_k: keep the ``top_k`` most likely tokens; ``0`` means off.
      top_p: nucleus mass in ``(0, 1]``; ``1.0`` means off.
      max_tokens: the most tokens to generate (finish reason ``"length"``).
      stop_token_ids: tokens that end the request (finish reason ``"stop"``); the stop token is
        kept as the last generated token, with its log-prob.
      ignore_eos: unless true, the model's end-of-sequence ids (``ModelConfig.eos_token_ids``)
        stop the request too.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self):
        t = self.temperature
        if (
            isinstance(t, bool)
            or not isinstance(t, (int, float, np.integer, np.floating))
            or not math.isfinite(t)
            or not (t == 0 or t >= MIN_TEMPERATURE)
        ):
            raise UsageError(
                f"temperature={t!r} is not accepted; it must be 0 (greedy) or a finite number "
                f">= {MIN_TEMPERATURE}"
            )
        if not _is_int(self.top_k) or self.top_k < 0:
            raise UsageError(
                f"top_k={self.top_k!r} is not accepted; it must be an integer >= 0 (0 = off)"
            )
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)) or not (
            0 < p <= 1
        ):
            raise UsageError(f"top_p={p!r} is not accepted; it must be in (0, 1] (1.0 = off)")
        m = self.max_tokens
        if not _is_int(m) or m < 1:
            raise UsageError(f"max_tokens={m!r} is not accepted; it must be an integer >= 1")
        stops = self.stop_token_ids
        if _is_int(stops) or isinstance(stops, (str, bytes)) or not all(
            _is_int(i) and i >= 0 for i in stops
        ):
            raise UsageError(
                f"stop_token_ids={stops!r} is not accepted; it must be a sequence of token ids >= 0"
            )
        object.__setattr__(self, "stop_token_ids", tuple(int(i) for i in stops))
        object.__setattr__(self, "temperature", float(t))
        object.__setattr__(self, "top_k", int(self.top_k))
        object.__setattr__(self, "top_p", float(p))
        object.__setattr__(self, "max_tokens", int(m))
        object.__setattr__(self, "ignore_eos", bool(self.ignore_eos))

    @classmethod
    def from_request(cls, sampling: Mapping[str, Any], stop_token_ids: Sequence[int]) -> SamplingParams:
        """The parameters of a rollout request's logged ``sampling`` table
        (``runtime.config.SamplingConfig.request``), stopping at ``stop_token_ids`` (the model's
        end-of-sequence ids)."""
        return cls(**sampling, stop_token_ids=tuple(stop_token_ids))

    def stop_ids(self, eos_token_ids: tuple[int, ...]) -> frozenset[int]:
        """The tokens that end this request for a model with these end-of-sequence ids."""
        eos = frozenset() if self.ignore_eos else frozenset(eos_token_ids)
        return frozenset(self.stop_token_ids) | eos


def finish_reason(
    token: int, num_generated: int, max_tokens: int, stop_ids: frozenset[int]
) -> str | None:
    """Why a request ends after generating ``token`` as its ``num_generated``-th token, or None."""
    if token in stop_ids:
        return FINISH_STOP
    if num_generated >= max_tokens:
        return FINISH_LENGTH
    return None


def seed_key_data(seed: int) -> np.ndarray:
    """``uint32[2]`` threefry key data of a request seed in ``[0, 2**64)``: ``[hi32, lo32]``."""
    if (
        isinstance(seed, bool)
        or not isinstance(seed, (int, np.integer))
        or not 0 <= seed < SEED_LIMIT
    ):
        raise UsageError(f"seed {seed!r} is not accepted; a seed is an integer in [0, 2**64)")
    seed = int(seed)
    return np.array([seed >> 32, seed & 0xFFFFFFFF], np.uint32)


def token_keys(key_data_B2: jax.Array, index_B: jax.Array) -> jax.Array:
    """``fold_in(key(seed_b), index_b)`` for each row: typed threefry keys ``[B]``."""
    keys_B = jax.random.wrap_key_data(key_data_B2.astype(jnp.uint32), impl="threefry2x32")
    return jax.vmap(jax.random.fold_in)(keys_B, index_B.astype(jnp.uint32))


def truncation_mask(scaled_BV: jax.Array, top_k_B: jax.Array, top_p_B: jax.Array) -> jax.Array:
    """``bool[B, V]``: the tokens top-k then top-p keep, from tempered logits ``scaled_BV``."""
    V = scaled_BV.shape[-1]
    rank_V = jnp.arange(V)
    sorted_BV = jnp.flip(jnp.sort(scaled_BV, axis=-1), axis=-1)  # descending
    k_B1 = jnp.where(top_k_B > 0, jnp.minimum(top_k_B, V), V)[:, None]
    in_top_k_BV = rank_V[None, :] < k_B1
    probs_BV = jax.nn.softmax(jnp.where(in_top_k_BV, sorted_BV, -jnp.inf), axis=-1)
    # Mass strictly before each rank: a cumulative sum of non-negatives, so non-decreasing and
    # the kept ranks form a prefix.
    cum_BV = jnp.cumsum(probs_BV, axis=-1)
    before_BV = jnp.concatenate([jnp.zeros_like(cum_BV[:, :1]), cum_BV[:, :-1]], axis=-1)
    kept_BV = in_top_k_BV & ((before_BV < top_p_B[:, None]) | (top_p_B[:, None] >= 1.0))
    kept_BV = kept_BV | (rank_V[None, :] == 0)
    last_kept_B1 = jnp.sum(kept_BV, axis=-1, keepdims=True) - 1
    threshold_B1 = jnp.take_along_axis(sorted_BV, last_kept_B1, axis=-1)
    return scaled_BV >= threshold_B1


def sample(
    logits_BV: jax.Array,
    key_data_B2: jax.Array,
    index_B: jax.Array,
    temperature_B: jax.Array,
    top_k_B: jax.Array,
    top_p_B: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Draw one token per row and its log-prob (see the module docstring).

    Args:
      logits_BV: float32 next-token logits.
      key_data_B2: uint32 ``seed_key_data`` of each row's request.
      index_B: int32 index ``t`` of the token being drawn among the request's generated tokens.
      temperature_B, top_k_B, top_p_B: each row's ``SamplingParams`` fields.

    Returns:
      ``(tokens_B int32, logprobs_B float32)``, ``logprobs_B = token_logprobs(logits, tokens, T)``.
    """
    logits_BV = logits_BV.astype(jnp.float32)
    greedy_B = temperature_B <= 0
    scaled_BV = logits_BV / jnp.where(greedy_B, 1.0, temperature_B)[:, None]
    # Without truncation the mask is all true, bit for bit, so the sort can be skipped when no
    # row truncates; a row's draw is the same whichever branch its batch takes.
    keep_BV = jax.lax.cond(
        jnp.any((top_k_B > 0) | (top_p_B < 1.0)),
        truncation_mask,
        lambda scaled_BV, *_: jnp.ones(scaled_BV.shape, bool),
        scaled_BV, top_k_B, top_p_B,
    )
    V = logits_BV.shape[-1]
    # Greedy rows never read the noise, so a batch of greedy rows skips drawing it; a sampled
    # row's noise is the same whichever branch its batch takes.
    gumbel_BV = jax.lax.cond(
        jnp.any(~greedy_B),
        lambda key_data_B2, index_B: jax.vmap(
            lambda key: jax.random.gumbel(key, (V,), jnp.float32)
        )(token_keys(key_data_B2, index_B)),
        lambda *_: jnp.zeros(logits_BV.shape, jnp.float32),
        key_data_B2, index_B,
    )
    drawn_B = jnp.argmax(jnp.where(keep_BV, scaled_BV + gumbel_BV, -jnp.inf), axis=-1)
    tokens_B = jnp.where(greedy_B, jnp.argmax(logits_BV, axis=-1), drawn_B).astype(jnp.int32)
    return tokens_B, token_logprobs(logits_BV, tokens_B, temperature_B)
