"""The decoder and its three forward paths: full sequence, paged prefill, paged decode.

All three are pure functions of ``(params, inputs, config)`` over the same parameters and the same
layer code; they differ only in how a layer attends:

- ``forward``: dense causal attention over a padded batch (training, log-prob recomputation).
- ``prefill``: a batch of prompts starting at position 0, padded to a common length; dense causal
  attention over the prompt, and every valid token's keys/values written to its pages.
- ``decode``: one new token per slot; its keys/values are written to its page, then it attends over
  everything cached (paged attention).

For a memory-bounded train step, ``hidden_states`` runs the full-sequence path up to the final norm
(optionally rematerialising every decoder layer) and ``head_logits`` turns any slice of those
hidden states into logits, so a caller can compute log-probs a few positions at a time.

``params`` is the flax parameter tree without the ``{"params": ...}`` wrapper. The KV cache is a
``KVCache`` of per-layer page arrays in the layout of ``kernels.paged_attention``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from kernels.attention import (
    causal_mask,
    dense_attention,
    query_blocked_attention,
    shared_prefix_attention,
)
from kernels.kv_pages import write_pages
from kernels.ordered_attention import ordered_attention
from kernels.paged_attention import paged_attention
from runtime.model.config import ModelConfig
from runtime.model.layers import MLP, Attend, Attention, DecoderLayer, RMSNorm, weight_init
from runtime.numerics import min_rows, pad_rows, padded_rows


class KVCache(NamedTuple):
    """Paged keys and values, one ``[num_kv_heads, total_pages, page_size, head_dim]`` per layer."""

    k_pages: tuple[jax.Array, ...]
    v_pages: tuple[jax.Array, ...]

    @property
    def page_size(self) -> int:
        return self.k_pages[0].shape[2]

    @property
    def num_pages(self) -> int:
        return self.k_pages[0].shape[1]

    @property
    def bytes_per_page(self) -> int:
        """Bytes one physical page takes over all layers, keys and values."""
        pages = self.k_pages + self.v_pages
        return sum(p.dtype.itemsize * p[:, 0].size for p in pages)


def init_cache(
    config: ModelConfig, *, num_pages: int, page_size: int, dtype: str | None = None
) -> KVCache:
    """Zero-filled cache of ``num_pages`` pages of ``page_size`` tokens (default: compute dtype)."""
    shape = (config.num_kv_heads, num_pages, page_size, config.head_dim)
    dt = jnp.dtype(dtype or config.dtype)
    return KVCache(
        k_pages=tuple(jnp.zeros(shape, dt) for _ in range(config.num_layers)),
        v_pages=tuple(jnp.zeros(shape, dt) for _ in range(config.num_layers)),
    )


class Transformer(nn.Module):
    """Embedding, ``num_layers`` decoder layers, final RMSNorm, LM head (or tied embedding)."""

    config: ModelConfig

    def setup(self):
        c = self.config
        self.embed_tokens = nn.Embed(
            c.vocab_size,
            c.hidden_size,
            dtype=c.compute_dtype,
            param_dtype=c.parameter_dtype,
            embedding_init=weight_init(c),
        )
        self.layers = [DecoderLayer(c, name=f"layers_{i}") for i in range(c.num_layers)]
        self.norm = RMSNorm(c)
        if not c.tie_word_embeddings:
            self.lm_head = nn.Dense(
                c.vocab_size,
                use_bias=False,
                dtype=c.compute_dtype,
                param_dtype=c.parameter_dtype,
                kernel_init=weight_init(c),
            )

    def __call__(
        self,
        tokens_BT: jax.Array,
        positions_BT: jax.Array,
        attends: Sequence[Attend],
        select_B: jax.Array | None = None,
        head: bool = True,
    ) -> tuple[jax.Array, list[object]]:
        """Float32 logits ``[B, T, V]`` (or ``[B, V]`` at ``select_B``) and each layer's state;
        without ``head``, the final-normed hidden states ``[B, T, D]`` in the compute dtype."""
        h_BTD = self.embed_tokens(tokens_BT.astype(jnp.int32))
        states = []
        for layer, attend in zip(self.layers, attends, strict=True):
            h_BTD, state = layer(h_BTD, positions_BT, attend)
            states.append(state)
        if select_B is not None:
            h_BTD = jnp.take_along_axis(h_BTD, select_B[:, None, None].astype(jnp.int32), axis=1)[
                :, 0
            ]
        h_BTD = self.norm(h_BTD)
        return (self.head(h_BTD) if head else h_BTD), states

    def head(self, h_XD: jax.Array) -> jax.Array:
        """Float32 logits ``[..., V]`` of final-normed hidden states ``[..., D]``."""
        if self.config.tie_word_embeddings:
            logits = self.embed_tokens.attend(h_XD)
        else:
            logits = self.lm_head(h_XD)
        return logits.astype(jnp.float32)


def init_params(config: ModelConfig, *, key: jax.Array) -> dict:
    """Random parameters: normal(0, initializer_range) weights, unit norm scales, zero biases."""
    tokens_BT = jnp.zeros((1, 1), jnp.int32)
    attends = [_dense_attend(config, causal_mask(tokens_BT == 0))] * config.num_layers
    return Transformer(config).init(key, tokens_BT, tokens_BT, attends)["params"]


def _dense_attend(config: ModelConfig, mask_BTS: jax.Array, query_block: int = 0) -> Attend:
    def attend(q_BTHD, k_BTKD, v_BTKD):
        if query_block > 0:
            return query_blocked_attention(
                q_BTHD, k_BTKD, v_BTKD, mask_BTS, scale=config.attention_scale, block=query_block
            ), None
        return dense_attention(q_BTHD, k_BTKD, v_BTKD, mask_BTS, scale=config.attention_scale), None

    return attend


def _apply(config, params, tokens_BT, positions_BT, attends, select_B=None, head=True):
    return Transformer(config).apply({"params": params}, tokens_BT, positions_BT, attends, select_B, head)


def _positions_and_mask(shape_BT, attention_mask_BT):
    """Positions and the causal attention mask of a padded batch (see ``forward``); for integer
    segment ids (a packed batch: each row several sequences numbered from 1, 0 on padding), each
    sequence's own positions from 0 and attention within it only."""
    if attention_mask_BT is None:
        attention_mask_BT = jnp.ones(shape_BT, bool)
    if jnp.issubdtype(attention_mask_BT.dtype, jnp.integer):
        segments_BT = attention_mask_BT
        valid_BT = segments_BT > 0
        t_T = jnp.arange(shape_BT[1])
        starts_BT = valid_BT & (segments_BT != jnp.pad(segments_BT, ((0, 0), (1, 0)))[:, :-1])
        first_BT = jax.lax.cummax(jnp.where(starts_BT, t_T[None, :], 0), axis=1)
        positions_BT = jnp.where(valid_BT, t_T[None, :] - first_BT, 0)
        same_BTS = segments_BT[:, :, None] == segments_BT[:, None, :]
        return positions_BT, causal_mask(valid_BT) & same_BTS
    valid_BT = attention_mask_BT.astype(bool)
    return jnp.maximum(jnp.cumsum(valid_BT, axis=1) - 1, 0), causal_mask(valid_BT)


def _dense_inputs(config: ModelConfig, tokens_BT, attention_mask_BT):
    """Positions and per-layer dense attention of a padded batch (see ``forward``)."""
    positions_BT, mask_BTS = _positions_and_mask(tokens_BT.shape, attention_mask_BT)
    return positions_BT, [_dense_attend(config, mask_BTS)] * config.num_layers


@functools.partial(jax.jit, static_argnames=("config",))
def forward(
    params: dict,
    tokens_BT: jax.Array,
    attention_mask_BT: jax.Array | None = None,
    *,
    config: ModelConfig,
) -> jax.Array:
    """Full-sequence logits, float32 ``[B, T, vocab]``; ``logits[b, t]`` predicts token ``t + 1``.

    ``attention_mask_BT`` (1 = real token, 0 = padding; default all ones) works for left- and
    right-padded batches alike, as in Hugging Face: the position of a token is the number of real
    tokens before it, and a query attends to real keys at or before it. Logits at padding
    positions are finite but meaningless.
    """
    positions_BT, attends = _dense_inputs(config, tokens_BT, attention_mask_BT)
    logits_BTV, _ = _apply(config, params, tokens_BT, positions_BT, attends)
    return logits_BTV


@functools.partial(jax.jit, static_argnames=("config", "group_size", "prefix", "head"))
def shared_prefix_forward(
    params: dict,
    tokens_BT: jax.Array,
    attention_mask_BT: jax.Array | None = None,
    *,
    config: ModelConfig,
    group_size: int,
    prefix: int,
    head: bool = True,
) -> jax.Array:
    """``forward``'s logits for rows whose first ``prefix`` tokens are the same in each group of
    ``group_size`` consecutive rows (a prompt and its sampled completions), computing that prefix
    once per group.

    The prefix positions run for the first row of each group only; the rest of each row attends
    to its group's prefix keys and values (``kernels.attention.shared_prefix_attention``) and to
    its own tokens as ``forward``'s row would. Every prefix token must be real (not padding): the
    caller passes at most the shortest prompt. The logits at prefix positions are the group's,
    repeated over its rows. A row's logits equal ``forward``'s up to float32 rounding; the work is
    ``M·prefix + B·(T - prefix)`` positions instead of ``B·T``. Without ``head``: the final-normed
    hidden states ``[B, T, D]`` instead of the logits (``hidden_states``'s, prefix shared).
    """
    B, T = tokens_BT.shape
    if not 0 < prefix < T or B % group_size:
        raise ValueError(f"a prefix of {prefix} tokens and groups of {group_size} rows do not fit a "
                         f"batch of shape {tokens_BT.shape}")
    positions_BT, mask_BTS = _positions_and_mask(tokens_BT.shape, attention_mask_BT)
    heads = [None] * config.num_layers  # each layer's prefix keys and values, [M, P, K, D]

    def prefix_attend(i):
        def attend(q, k, v):
            heads[i] = (k, v)
            return dense_attention(q, k, v, causal_mask(jnp.ones(q.shape[:2], bool)),
                                   scale=config.attention_scale), None
        return attend

    def rest_attend(i):
        def attend(q, k, v):
            k_prefix, v_prefix = heads[i]
            return shared_prefix_attention(q, k_prefix, v_prefix, k, v, mask_BTS[:, prefix:, prefix:],
                                           scale=config.attention_scale), None
        return attend

    first_MP = tokens_BT[::group_size, :prefix]
    prefix_out, _ = _apply(config, params, first_MP, positions_BT[::group_size, :prefix],
                           [prefix_attend(i) for i in range(config.num_layers)], head=head)
    rest_out, _ = _apply(config, params, tokens_BT[:, prefix:], positions_BT[:, prefix:],
                         [rest_attend(i) for i in range(config.num_layers)], head=head)
    return jnp.concatenate([jnp.repeat(prefix_out, group_size, axis=0), rest_out], axis=1)


def _ordered_attend(config: ModelConfig, mask_BTS: jax.Array, block: int) -> Attend:
    def attend(q_BTHD, k_BTKD, v_BTKD):
        return ordered_attention(q_BTHD, k_BTKD, v_BTKD, mask_BTS, scale=config.attention_scale,
                                 block=block), None

    return attend


def exact_rows(config: ModelConfig) -> int:
    """Fewest positions of a call of the exact mode for this model (``runtime.numerics.min_rows``)."""
    return min_rows(config.hidden_size, config.vocab_size)


def exact_head(params: dict, h_XD: jax.Array, *, config: ModelConfig) -> jax.Array:
    """The LM head's float32 logits ``[X, V]`` of final-normed hidden states ``[X, D]`` as the
    exact engine computes them: at least ``exact_rows`` rows (padded), laid out ``[X, 1, D]`` as
    a decode step's, accumulated in float32 and rounded to the compute dtype by an explicit
    ``reduce_precision``.

    ``head``'s values, with its rounding written out: ``head`` casts a compute-dtype product to
    float32, and in bfloat16 XLA:CPU keeps or drops that rounding as the program around it is
    fused (measured: a forward-only scoring program fused the cast into the log-softmax and gave
    other bits on every token than the engine's, which stores its logits, and the train step's).
    A ``reduce_precision`` is an operation of its own, kept in every program.
    """
    X = h_XD.shape[0]
    dtype = config.compute_dtype
    h_X1D = pad_rows(h_XD, padded_rows(X, least=exact_rows(config)))[:, None].astype(dtype)
    if config.tie_word_embeddings:
        w_DV = params["embed_tokens"]["embedding"].astype(dtype).T
    else:
        w_DV = params["lm_head"]["kernel"].astype(dtype)
    logits_X1V = jnp.dot(h_X1D, w_DV, preferred_element_type=jnp.float32)
    if dtype != jnp.float32:
        info = jnp.finfo(dtype)
        logits_X1V = jax.lax.reduce_precision(logits_X1V, exponent_bits=info.nexp, mantissa_bits=info.nmant)
    return logits_X1V[:X, 0]


@functools.partial(jax.jit, static_argnames=("config", "block", "group_size", "prefix"))
def exact_hidden(
    params: dict,
    tokens_BT: jax.Array,
    attention_mask_BT: jax.Array,
    *,
    config: ModelConfig,
    block: int,
    group_size: int = 1,
    prefix: int = 0,
) -> jax.Array:
    """``exact_forward``'s final-normed hidden states ``[B, T, D]``, with the first ``prefix``
    positions of each group of ``group_size`` rows (one prompt's samples) computed once per group.

    The prefix runs for each group's first row only (its queries see only prefix keys), the rest of
    every row with its group's prefix keys and values placed before its own, so each query sees
    the keys it would in its full row, in the same ``block``-key blocks (a prefix need not end on a
    block boundary): the bits of the full rows, for ``M·prefix + B·(T - prefix)`` positions. Each
    call is padded to at least ``exact_rows`` positions. Every prefix token must be real.
    """
    B, T = tokens_BT.shape
    least = exact_rows(config)

    def run(tokens_bt, positions_bt, attends):
        rows = padded_rows(tokens_bt.shape[0], tokens_bt.shape[1], least=least)
        h_btD, _ = _apply(config, params, pad_rows(tokens_bt, rows), pad_rows(positions_bt, rows), attends, head=False)
        return h_btD[: tokens_bt.shape[0]]

    positions_BT, mask_BTS = _positions_and_mask(tokens_BT.shape, attention_mask_BT)
    if prefix <= 0:
        return run(tokens_BT, positions_BT, [_ordered_attend(config, pad_rows(mask_BTS, padded_rows(B, T, least=least)),
                                                             block)] * config.num_layers)
    if not 0 < prefix < T or B % group_size:
        raise ValueError(f"a prefix of {prefix} tokens and groups of {group_size} rows do not fit a "
                         f"batch of shape {tokens_BT.shape}")
    M = B // group_size
    kept: list = [None] * config.num_layers  # each layer's prefix keys and values, [M, P, K, D]

    def prefix_attend(i, mask_MPP):
        def attend(q, k, v):
            kept[i] = (k, v)
            return ordered_attention(q, k, v, mask_MPP, scale=config.attention_scale, block=block), None
        return attend

    def rest_attend(i, mask_BRT):
        def attend(q, k, v):
            k_prefix, v_prefix = (jnp.repeat(x[:M], group_size, axis=0) for x in kept[i])
            rows = q.shape[0]
            k_all = jnp.concatenate([pad_rows(k_prefix, rows), k], axis=1)
            v_all = jnp.concatenate([pad_rows(v_prefix, rows), v], axis=1)
            return ordered_attention(q, k_all, v_all, mask_BRT, scale=config.attention_scale, block=block), None
        return attend

    m_rows = padded_rows(M, prefix, least=least)
    mask_MPP = pad_rows(causal_mask(jnp.ones((M, prefix), bool)), m_rows)
    prefix_BPD = run(tokens_BT[::group_size, :prefix], positions_BT[::group_size, :prefix],
                     [prefix_attend(i, mask_MPP) for i in range(config.num_layers)])
    b_rows = padded_rows(B, T - prefix, least=least)
    mask_BRT = pad_rows(mask_BTS[:, prefix:, :], b_rows)
    rest_BRD = run(tokens_BT[:, prefix:], positions_BT[:, prefix:],
                   [rest_attend(i, mask_BRT) for i in range(config.num_layers)])
    return jnp.concatenate([jnp.repeat(prefix_BPD, group_size, axis=0), rest_BRD], axis=1)


@functools.partial(jax.jit, static_argnames=("config", "block"))
def exact_forward(
    params: dict,
    tokens_BT: jax.Array,
    attention_mask_BT: jax.Array | None = None,
    *,
    config: ModelConfig,
    block: int,
) -> jax.Array:
    """``forward``'s logits with the engine's exact-mode bits (``runtime.numerics``).

    Every position's logits are those the exact engine (pages of ``block`` tokens) computed for
    it, in a prefill or a decode step: ``exact_hidden``'s hidden states (attention in
    ``kernels.ordered_attention``'s order over ``block``-token blocks of the row; a sequence must
    start on a block boundary: position 0 of a row, or of a packed sequence placed there), then
    ``exact_head`` at every position.
    """
    B, T = tokens_BT.shape
    if attention_mask_BT is None:
        attention_mask_BT = jnp.ones((B, T), bool)
    h_BTD = exact_hidden(params, tokens_BT, attention_mask_BT, config=config, block=block)
    return exact_head(params, h_BTD.reshape(B * T, -1), config=config).reshape(B, T, -1)


# Queries per attention block in a rematerialised layer (``kernels.attention``'s
# ``query_blocked_attention``): [B, heads, 64, T] float32 scores instead of [B, heads, T, T].
REMAT_QUERY_BLOCK = 64
# Positions per MLP block in a rematerialised layer: [B, 512, intermediate] activations at a time.
REMAT_TOKEN_BLOCK = 512


def _layer(config: ModelConfig, layer_params, h_BTD, positions_BT, mask_BTS, query_block=0):
    if query_block > 0:
        # The rematerialised path. Inside a loop (micro-batches), XLA hoists every loop-invariant
        # weight cast out of it (on XLA:CPU a bfloat16 matmul reads float32 copies of its bfloat16
        # weights, some transposed), so the copies of all layers would live through the whole
        # loop. Adding 0·h (no constant to XLA: NaN for an infinite h) ties the weights to this
        # layer's input, so their casts happen where the layer runs, one layer's at a time; no
        # value changes (up to the sign of a zero weight).
        zero = jax.lax.stop_gradient(h_BTD.reshape(-1)[0]) * 0
        layer_params = jax.tree.map(lambda w: w + zero.astype(w.dtype), layer_params)
    attend = _dense_attend(config, mask_BTS, query_block)
    if query_block > 0:
        return _blocked_layer(config, layer_params, h_BTD, positions_BT, attend)
    h_BTD, _ = DecoderLayer(config).apply({"params": layer_params}, h_BTD, positions_BT, attend)
    return h_BTD


def _blocked_layer(config: ModelConfig, p, h_BTD, positions_BT, attend):
    """``DecoderLayer`` (the same modules and arithmetic) with its MLP ``REMAT_TOKEN_BLOCK``
    positions at a time, each block under ``jax.checkpoint``: the MLP acts on every position
    alone, and one block's float32 ``[B, block, intermediate]`` activations live at a time."""
    x_BTD = cast(jax.Array, RMSNorm(config).apply({"params": p["input_layernorm"]}, h_BTD))
    attn_BTD, _ = Attention(config).apply({"params": p["self_attn"]}, x_BTD, positions_BT, attend)
    h_BTD = h_BTD + attn_BTD
    x_BTD = cast(
        jax.Array, RMSNorm(config).apply({"params": p["post_attention_layernorm"]}, h_BTD)
    )
    T = x_BTD.shape[1]

    @jax.checkpoint
    def mlp(x_BCD):
        return MLP(config).apply({"params": p["mlp"]}, x_BCD)

    outs = [mlp(x_BTD[:, s:s + REMAT_TOKEN_BLOCK]) for s in range(0, T, REMAT_TOKEN_BLOCK)]
    return h_BTD + jnp.concatenate(outs, axis=1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _remat_layer(config: ModelConfig, layer_params, h_BTD, positions_BT, mask_BTS):
    """One decoder layer whose backward pass recomputes it from its input (rematerialisation),
    its attention ``REMAT_QUERY_BLOCK`` queries at a time."""
    return _layer(config, layer_params, h_BTD, positions_BT, mask_BTS, REMAT_QUERY_BLOCK)


def _remat_layer_fwd(config, layer_params, h_BTD, positions_BT, mask_BTS):
    out_BTD = _layer(config, layer_params, h_BTD, positions_BT, mask_BTS, REMAT_QUERY_BLOCK)
    return out_BTD, (layer_params, h_BTD, positions_BT, mask_BTS)


def _remat_layer_bwd(config, residuals, g_BTD):
    layer_params, h_BTD, positions_BT, mask_BTS = residuals
    # ``jax.checkpoint`` alone does not bound memory on XLA:CPU, which merges the recomputation
    # with the forward pass (or runs it early) and so keeps every layer's attention weights. Adding
    # 0·g (not foldable: it is NaN for an infinite g) makes the recomputation wait for this
    # layer's cotangent and differ from the forward pass, so one layer's insides live at a time.
    h_BTD = h_BTD + (g_BTD.reshape(-1)[0] * 0).astype(h_BTD.dtype)
    _, vjp = jax.vjp(
        lambda p, h: _layer(config, p, h, positions_BT, mask_BTS, REMAT_QUERY_BLOCK),
        layer_params, h_BTD,
    )
    d_params, d_h_BTD = vjp(g_BTD)
    no_cotangent = [np.zeros(x.shape, jax.dtypes.float0) for x in (positions_BT, mask_BTS)]
    return (d_params, d_h_BTD, *no_cotangent)


_remat_layer.defvjp(_remat_layer_fwd, _remat_layer_bwd)


@functools.partial(jax.jit, static_argnames=("config", "remat"))
def hidden_states(
    params: dict,
    tokens_BT: jax.Array,
    attention_mask_BT: jax.Array | None = None,
    *,
    config: ModelConfig,
    remat: bool = False,
) -> jax.Array:
    """Final-normed hidden states ``[B, T, D]`` (compute dtype): ``forward`` without its head.

    ``head_logits(params, hidden_states(...))`` are ``forward``'s logits up to the rounding of
    matmuls of other shapes. ``remat`` rematerialises every decoder layer under differentiation.
    """
    if not remat:
        positions_BT, attends = _dense_inputs(config, tokens_BT, attention_mask_BT)
        h_BTD, _ = Transformer(config).apply(
            {"params": params}, tokens_BT, positions_BT, attends, head=False
        )
        return h_BTD
    return decoder(params, embed(params, tokens_BT, config=config), attention_mask_BT,
                   config=config, remat=True)


def embed(params: dict, tokens_BT: jax.Array, *, config: ModelConfig) -> jax.Array:
    """The token embeddings ``[B, T, D]`` (compute dtype) that the first layer reads."""
    # The rows, then their cast: the same values as the flax lookup, which casts the whole table.
    table_VD = params["embed_tokens"]["embedding"]
    return jnp.take(table_VD, tokens_BT.astype(jnp.int32), axis=0).astype(config.compute_dtype)


def decoder(
    params: dict,
    h_BTD: jax.Array,
    attention_mask_BT: jax.Array | None = None,
    *,
    config: ModelConfig,
    remat: bool = True,
) -> jax.Array:
    """The decoder layers and the final norm over embeddings ``h_BTD``: ``hidden_states`` from
    ``embed``'s output, each layer applied on its own (rematerialised with ``remat``). Reads no
    embedding or LM head parameters, so a caller can differentiate it without them."""
    positions_BT, mask_BTS = _positions_and_mask(h_BTD.shape[:2], attention_mask_BT)
    for i in range(config.num_layers):
        layer_params = params[f"layers_{i}"]
        if remat:
            h_BTD = _remat_layer(config, layer_params, h_BTD, positions_BT, mask_BTS)
        else:
            h_BTD = _layer(config, layer_params, h_BTD, positions_BT, mask_BTS)
    norm = RMSNorm(config).apply({"params": params["norm"]}, h_BTD)
    return cast(jax.Array, norm)


def decoder_sweep(
    params: dict,
    h_BTD: jax.Array,
    attention_mask_BT: jax.Array | None = None,
    *,
    config: ModelConfig,
) -> tuple[jax.Array, Callable[[jax.Array, Callable[[str, dict], None]], jax.Array]]:
    """``decoder(..., remat=True)`` and its backward pass, one module at a time.

    Returns ``(out_BTD, backward)``. ``backward(g_BTD, take)`` runs the final norm's VJP, then
    every layer's from the last to the first, each recomputed from its input as the
    rematerialised ``decoder`` does, and hands each module's parameter cotangent to
    ``take(name, d_params)`` (``"norm"``, ``"layers_{i}"``) as soon as it exists; it returns the
    cotangent of ``h_BTD``. A caller that adds each one into an accumulator keeps one layer's
    parameter gradient alive at a time, where ``jax.vjp`` of ``decoder`` returns all of them
    at once.
    """
    positions_BT, mask_BTS = _positions_and_mask(h_BTD.shape[:2], attention_mask_BT)
    inputs = []
    for i in range(config.num_layers):
        inputs.append(h_BTD)
        h_BTD = _layer(
            config, params[f"layers_{i}"], h_BTD, positions_BT, mask_BTS, REMAT_QUERY_BLOCK
        )
    out_BTD, norm_vjp = jax.vjp(
        lambda p, h: RMSNorm(config).apply({"params": p}, h), params["norm"], h_BTD
    )

    def backward(g_BTD: jax.Array, take: Callable[[str, dict], None]) -> jax.Array:
        d_norm, g_BTD = norm_vjp(g_BTD)
        take("norm", d_norm)
        for i in reversed(range(config.num_layers)):
            (d_params, g_BTD, _, _) = _remat_layer_bwd(
                config, (params[f"layers_{i}"], inputs[i], positions_BT, mask_BTS), g_BTD
            )
            take(f"layers_{i}", d_params)
        return g_BTD

    return cast(jax.Array, out_BTD), backward


def head_logits(params: dict, h_XD: jax.Array, *, config: ModelConfig) -> jax.Array:
    """Float32 logits ``[..., V]`` of final-normed hidden states ``[..., D]`` (the LM head)."""
    logits = Transformer(config).apply({"params": params}, h_XD, method=Transformer.head)
    return cast(jax.Array, logits)


def _write_attend(k_pages, v_pages, positions_BT, page_indices_BP, valid_BT, attention) -> Attend:
    def attend(q_BTHD, k_BTKD, v_BTKD):
        new_k = write_pages(k_pages, k_BTKD, positions_BT, page_indices_BP, valid_BT)
        new_v = write_pages(v_pages, v_BTKD, positions_BT, page_indices_BP, valid_BT)
        return attention(q_BTHD, k_BTKD, v_BTKD, new_k, new_v), (new_k, new_v)

    return attend


def _collect(states) -> KVCache:
    return KVCache(k_pages=tuple(k for k, _ in states), v_pages=tuple(v for _, v in states))


@functools.partial(jax.jit, static_argnames=("config", "exact_block"), donate_argnames=("cache",))
def prefill(
    params: dict,
    tokens_BT: jax.Array,
    lengths_B: jax.Array,
    cache: KVCache,
    page_indices_BP: jax.Array,
    *,
    config: ModelConfig,
    exact_block: int = 0,
) -> tuple[jax.Array, KVCache]:
    """Run prompts from position 0, write their keys/values, return the next-token logits.

    Args:
      tokens_BT: prompts right-padded to a common length ``T`` (e.g. a power-of-two bucket).
      lengths_B: int32 number of real tokens of each prompt (``1 <= length <= T``; a row with
        length 0 writes nothing and its logits are meaningless).
      cache: the KV cache. DONATES cache.
      page_indices_BP: the page table rows of these sequences; it must hold pages for positions
        ``0 .. length - 1``.
      exact_block: > 0, the exact mode (``runtime.numerics``): attention in
        ``kernels.ordered_attention``'s order over blocks of this many keys (the cache's page
        size), every call over at least ``exact_rows`` rows (empty rows added); the
        logits are then ``exact_forward``'s bits for the same prompt.

    Returns:
      ``(logits_BV, cache)``: float32 logits at position ``length - 1`` (the distribution of the
      first generated token) and the cache with positions ``0 .. length - 1`` written.
    """
    given, T = tokens_BT.shape
    if exact_block > 0:  # empty rows (length 0) write nothing
        rows = padded_rows(given, T, least=exact_rows(config))
        tokens_BT, lengths_B = pad_rows(tokens_BT, rows), pad_rows(lengths_B, rows)
        page_indices_BP = pad_rows(page_indices_BP, rows)
    B = tokens_BT.shape[0]
    positions_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    valid_BT = positions_BT < lengths_B[:, None]
    mask_BTS = causal_mask(valid_BT)

    def attention(q_BTHD, k_BTKD, v_BTKD, k_pages, v_pages):
        del k_pages, v_pages  # the prompt's own keys/values are all there is to attend to
        if exact_block > 0:
            return ordered_attention(q_BTHD, k_BTKD, v_BTKD, mask_BTS, scale=config.attention_scale,
                                     block=exact_block)
        return dense_attention(q_BTHD, k_BTKD, v_BTKD, mask_BTS, scale=config.attention_scale)

    attends = [
        _write_attend(k, v, positions_BT, page_indices_BP, valid_BT, attention)
        for k, v in zip(cache.k_pages, cache.v_pages, strict=True)
    ]
    last_B = jnp.maximum(lengths_B - 1, 0)
    if exact_block > 0:
        # The final norm over every position (as many rows as the layers'), then the last ones.
        h_BTD, states = _apply(config, params, tokens_BT, positions_BT, attends, head=False)
        h_BD = jnp.take_along_axis(h_BTD, last_B[:, None, None].astype(jnp.int32), axis=1)[:, 0]
        return exact_head(params, h_BD, config=config)[:given], _collect(states)
    logits_BV, states = _apply(config, params, tokens_BT, positions_BT, attends, last_B)
    return logits_BV, _collect(states)


@functools.partial(
    jax.jit, static_argnames=("config", "attention_impl"), donate_argnames=("cache",)
)
def decode(
    params: dict,
    tokens_B: jax.Array,
    positions_B: jax.Array,
    cache: KVCache,
    page_indices_BP: jax.Array,
    *,
    config: ModelConfig,
    attention_impl: str = "reference",
) -> tuple[jax.Array, KVCache]:
    """One decode step for every slot of a fixed-size batch.

    Args:
      tokens_B: int32 the token fed to each slot (the last sampled one).
      positions_B: int32 position of that token in its sequence, i.e. the number of tokens already
        cached for the slot. A negative position marks an empty slot: nothing is written and its
        logits are finite but meaningless.
      cache: the KV cache. DONATES cache.
      page_indices_BP: int32 page table, fixed width; it must hold a page for ``positions_B``.
      attention_impl: one of ``kernels.paged_attention.IMPLS`` (default ``"reference"``);
        ``"ordered"`` is the exact mode (``runtime.numerics``): every call over at least
        ``exact_rows`` rows (empty slots added), the logits ``exact_head``'s (``exact_forward``'s bits).

    Returns:
      ``(logits_BV, cache)``: float32 next-token logits and the cache with the new tokens written.
      A slot's results depend only on its own inputs (batch invariance at a fixed batch shape).
    """
    given = tokens_B.shape[0]
    if attention_impl == "ordered":  # empty slots (position -1) write nothing
        rows = padded_rows(given, least=exact_rows(config))
        tokens_B, positions_B = pad_rows(tokens_B, rows), pad_rows(positions_B, rows, -1)
        page_indices_BP = pad_rows(page_indices_BP, rows)
    active_B = positions_B >= 0
    positions_B1 = positions_B[:, None]
    lengths_B = jnp.where(active_B, positions_B + 1, 0).astype(jnp.int32)

    def attention(q_BTHD, k_BTKD, v_BTKD, k_pages, v_pages):
        del k_BTKD, v_BTKD  # read back from the cache, where they were just written
        out_BHD = paged_attention(
            q_BTHD[:, 0],
            k_pages,
            v_pages,
            lengths_B,
            page_indices_BP,
            scale=config.attention_scale,
            impl=attention_impl,
        )
        return out_BHD[:, None]

    attends = [
        _write_attend(k, v, positions_B1, page_indices_BP, active_B[:, None], attention)
        for k, v in zip(cache.k_pages, cache.v_pages, strict=True)
    ]
    if attention_impl == "ordered":  # the exact head (its rounding written out), as the prefill's and the trainer's
        h_B1D, states = _apply(config, params, tokens_B[:, None], positions_B1, attends, head=False)
        return exact_head(params, h_B1D[:, 0], config=config)[:given], _collect(states)
    logits_B1V, states = _apply(config, params, tokens_B[:, None], positions_B1, attends)
    return logits_B1V[:given, 0], _collect(states)
