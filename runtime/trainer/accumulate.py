"""One micro-batch's parameter gradient of ``Σ_{b,t} g_{b,t} ℓ_{b,t}``, added into the accumulator.

The second pass of the micro-batched step (``runtime.trainer.step``): given the cotangent
``g = ∂L/∂ℓ`` of the whole batch's objective, each micro-batch adds ``Σ g ∇θ ℓ`` to the running
gradient. Plain autodiff of the log-probs would give the same sum, but it builds every
vocabulary-sized gradient (``[V, D]`` float32, 0.5 GiB for a 150k vocabulary) as a fresh array
several times over: once per logits chunk, once for the embedding lookup, once more for their sum.
Here the decoder layers and the final norm are differentiated by ``jax.vjp`` (rematerialised with
``remat``); the LM head and the embedding lookup, which are a matmul and a gather, are
differentiated by hand, writing into the accumulator's own leaves in place:

- head, per chunk of ``C`` positions (tempered log-softmax ``ℓ = z_y/T - logsumexp(z/T)``):
  ``∂ℓ/∂z = (onehot_y - p) / T``, so with ``dz = g (onehot_y - p) / T``,
  ``∂h = dz · W`` and ``∂W += dzᵀ · h``, the latter one block of vocabulary rows at a time;
- embedding: ``∂E[token] += ∂h_0`` for every position, a scatter-add into the accumulator.

The head's weight is read one block of vocabulary rows at a time (the logits, ``∂h`` and ``∂W``
alike), so no full-size cast of it (a float32 copy on XLA:CPU) is ever made. Matmul products
accumulate in float32 whatever the compute dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.logprobs import tempered_log_softmax
from runtime.model import ModelConfig
from runtime.model.transformer import decoder, decoder_sweep, embed

VOCAB_BLOCK = 8192  # most vocabulary rows per head-gradient product: [VOCAB_BLOCK, D] float32


def _block(vocab: int) -> int:
    """The largest divisor of ``vocab`` not above ``VOCAB_BLOCK`` (fixed-size dynamic slices)."""
    return max(d for d in range(1, min(vocab, VOCAB_BLOCK) + 1) if vocab % d == 0)


def _head_path(config: ModelConfig) -> tuple[str, str]:
    return ("embed_tokens", "embedding") if config.tie_word_embeddings else ("lm_head", "kernel")


def head_weight(params, config: ModelConfig):
    """The LM head's weight: the embedding ``[V, D]`` when tied, else the head's ``[D, V]``."""
    module, leaf = _head_path(config)
    return params[module][leaf]


def _weight_block(w, start, size: int, *, config: ModelConfig):
    """Vocabulary rows ``start ..`` of the head weight (tied ``[V, D]``, untied ``[D, V]``) in the
    compute dtype: only ``size`` rows are ever cast, never a copy of the whole weight."""
    axis = 0 if config.tie_word_embeddings else 1
    return jax.lax.dynamic_slice_in_dim(w, start, size, axis=axis).astype(config.compute_dtype)


def blocked_head_logits(w, h_XD, *, config: ModelConfig):
    """``head_logits`` with the head weight ``w`` read one block of vocabulary rows at a time.

    Each logit is the same product as ``head_logits``'s (compute dtype, then float32); a float32
    copy of the whole weight, which XLA:CPU makes for a bfloat16 matmul over all of it
    (0.5 GiB for a 150k vocabulary), is never built.
    """
    V = config.vocab_size
    block = _block(V)
    h_XD = h_XD.astype(config.compute_dtype)

    def logits_block(k, logits_XV):
        w_blk = _weight_block(w, k * block, block, config=config)
        spec = "...d,kd->...k" if config.tie_word_embeddings else "...d,dk->...k"
        z_XK = jnp.einsum(spec, h_XD, w_blk).astype(jnp.float32)
        return jax.lax.dynamic_update_slice_in_dim(logits_XV, z_XK, k * block, axis=-1)

    return jax.lax.fori_loop(
        0, V // block, logits_block, jnp.zeros(h_XD.shape[:-1] + (V,), jnp.float32)
    )


def accumulate(grads, params, tokens_bT, attention_bT, cotangent_bS, *, config: ModelConfig,
               chunk: int, temperature: float, remat: bool):
    """``grads + ∇θ Σ_{b,t} g_{b,t} ℓ_{b,t}`` for one micro-batch (see the module docstring).

    Args:
      grads: the running gradient, float32, with the structure of ``params``.
      params: the parameters (float32 master weights).
      tokens_bT, attention_bT: the micro-batch.
      cotangent_bS: ``g = ∂L/∂ℓ`` of its rows, float32 ``[b, T-1]``.
      config: the model.
      chunk: positions per head chunk.
      temperature: the sampling temperature that divides the logits (non-positive: 1).
      remat: rematerialise each decoder layer.
    """
    b, T = tokens_bT.shape
    S = T - 1
    N = -(-S // chunk)
    inv_t = 1.0 / (temperature if temperature > 0 else 1.0)
    head_module, head_leaf = _head_path(config)
    trunk = {k: v for k, v in params.items() if k not in ("embed_tokens", "lm_head")}
    h0_bTD = embed(params, tokens_bT, config=config)
    if remat:
        h_bTD, sweep = decoder_sweep(params, h0_bTD, attention_bT, config=config)
    else:
        h_bTD, trunk_vjp = jax.vjp(
            lambda p, h0: decoder(p, h0, attention_bT, config=config, remat=False), trunk, h0_bTD
        )

    w = params[head_module][head_leaf]  # tied: [V, D]; untied: [D, V]
    V = config.vocab_size
    block = _block(V)
    compute = config.compute_dtype
    pad = N * chunk - S
    h_NbCD = jnp.moveaxis(
        jnp.pad(h_bTD[:, :S], ((0, 0), (0, pad), (0, 0))).reshape(b, N, chunk, -1), 1, 0
    )
    targets_NbC = jnp.moveaxis(
        jnp.pad(tokens_bT[:, 1:], ((0, 0), (0, pad))).reshape(b, N, chunk), 1, 0
    )
    g_NbC = jnp.moveaxis(jnp.pad(cotangent_bS, ((0, 0), (0, pad))).reshape(b, N, chunk), 1, 0)

    def head_chunk(dw, inputs):
        h_bCD, targets_bC, g_bC = inputs
        logp_bCV = tempered_log_softmax(blocked_head_logits(w, h_bCD, config=config), temperature)
        vocab_11V = jnp.arange(V, dtype=jnp.int32)[None, None, :]
        onehot_bCV = targets_bC[..., None].astype(jnp.int32) == vocab_11V
        dz_bCV = (g_bC[..., None] * inv_t) * (onehot_bCV.astype(jnp.float32) - jnp.exp(logp_bCV))
        dz_bCV = dz_bCV.astype(compute)

        # The head weight is [V, D] when tied to the embedding, [D, V] otherwise (as forward).
        w_spec, v_axis = ("kd", 0) if config.tie_word_embeddings else ("dk", 1)

        def vocab_block(k, carry):
            dw, dh_bCD = carry
            dz_bCK = jax.lax.dynamic_slice_in_dim(dz_bCV, k * block, block, axis=2)
            w_blk = _weight_block(w, k * block, block, config=config)
            dh_bCD = dh_bCD + jnp.einsum(
                f"bck,{w_spec}->bcd", dz_bCK, w_blk, preferred_element_type=jnp.float32
            )
            dw_blk = jnp.einsum(f"bck,bcd->{w_spec}", dz_bCK, h_bCD, preferred_element_type=jnp.float32)
            old_blk = jax.lax.dynamic_slice_in_dim(dw, k * block, block, axis=v_axis)
            dw = jax.lax.dynamic_update_slice_in_dim(dw, old_blk + dw_blk, k * block, axis=v_axis)
            return dw, dh_bCD

        dh_bCD = jnp.zeros(h_bCD.shape, jnp.float32)
        dw, dh_bCD = jax.lax.fori_loop(0, V // block, vocab_block, (dw, dh_bCD))
        return dw, dh_bCD

    dw, dh_NbCD = jax.lax.scan(
        head_chunk, grads[head_module][head_leaf], (h_NbCD, targets_NbC, g_NbC)
    )
    dh_bSD = jnp.moveaxis(dh_NbCD, 0, 1).reshape(b, N * chunk, -1)[:, :S]
    # The last position predicts nothing: its hidden state gets no cotangent.
    dh_bTD = jnp.pad(dh_bSD, ((0, 0), (0, 1), (0, 0))).astype(h_bTD.dtype)
    grads = dict(grads)
    if remat:
        def take(name, d):
            grads[name] = jax.tree.map(jnp.add, grads[name], d)

        dh0_bTD = sweep(dh_bTD, take)
    else:
        d_trunk, dh0_bTD = trunk_vjp(dh_bTD)
        for k, d in d_trunk.items():
            grads[k] = jax.tree.map(jnp.add, grads[k], d)
    grads[head_module] = {**grads[head_module], head_leaf: dw}
    embedding = grads["embed_tokens"]["embedding"]
    embedding = embedding.at[tokens_bT.astype(jnp.int32)].add(dh0_bTD.astype(embedding.dtype))
    grads["embed_tokens"] = {**grads["embed_tokens"], "embedding": embedding}
    return grads
