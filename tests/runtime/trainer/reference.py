"""A slow, obvious NumPy float64 reference of REINFORCE and GRPO on a packed batch.

Written from /work/shared/spec/objectives.md (§1 notation, §4 advantages, §6.1, §6.2) with loops
over rows and tokens, and none of ``kernels/``: the log-prob of a target is ``log_softmax(z / T)``
of the logits one position earlier; the loss and its derivative in every log-prob are closed
forms; the derivative in the logits is ``∂ℓ/∂z_v = (onehot_v - p_v) / T``.
"""

from __future__ import annotations

import numpy as np


def token_logprobs(logits_BTV: np.ndarray, tokens_BT: np.ndarray, temperature: float):
    """``(logp_BS, probs_BSV)``: ``ℓ[b, t] = log p_T(tokens[b, t+1] | logits[b, t])``."""
    z_BSV = np.asarray(logits_BTV, np.float64)[:, :-1] / temperature
    B, S, _ = z_BSV.shape
    logp_BS = np.zeros((B, S))
    probs_BSV = np.zeros(z_BSV.shape)
    for b in range(B):
        for t in range(S):
            z = z_BSV[b, t] - np.max(z_BSV[b, t])
            log_norm = np.log(np.sum(np.exp(z)))
            logp_BS[b, t] = z[tokens_BT[b, t + 1]] - log_norm
            probs_BSV[b, t] = np.exp(z - log_norm)
    return logp_BS, probs_BSV


def grpo_advantages(rewards_MG: np.ndarray, eps: float) -> np.ndarray:
    """``(R_i - mean_g R) / (std_g R + ε_A)`` with the Bessel-corrected std; 0 for equal rewards."""
    advantages = []
    for group in np.asarray(rewards_MG, np.float64):
        if np.all(group == group[0]):
            advantages += [0.0] * len(group)
        else:
            advantages += list((group - group.mean()) / (group.std(ddof=1) + eps))
    return np.asarray(advantages)


def reinforce(logp_BS, mask_BS, advantages_B):
    """§6.1: ``L = -(1/N_seq) Σ_i Â_i Σ_t m ℓ``; returns ``(loss, ∂L/∂ℓ [B, S])``."""
    rows = [b for b in range(len(mask_BS)) if mask_BS[b].any()]
    loss, grad_BS = 0.0, np.zeros(logp_BS.shape)
    for b in rows:
        for t in np.flatnonzero(mask_BS[b]):
            loss -= advantages_B[b] * logp_BS[b, t] / len(rows)
            grad_BS[b, t] = -advantages_B[b] / len(rows)
    return loss, grad_BS


def grpo(logp_BS, logp_old_BS, mask_BS, advantages_B, clip: float):
    """§6.2 with β = 0: ``L = (1/N_seq) Σ_i (1/|o_i|) Σ_t L^clip_{i,t}``, the clipped per-token loss
    ``-A min(r, 1+ε)`` for ``A > 0`` and ``|A| max(r, 1-ε)`` for ``A < 0``, ``r = exp(ℓ - ℓ_old)``.

    Its derivative in ``ℓ`` is ``-w A r`` on tokens inside the trust region (``r < 1+ε`` for
    ``A > 0``, ``r > 1-ε`` for ``A < 0``) and 0 on clipped ones. Returns ``(loss, ∂L/∂ℓ)``.
    """
    rows = [b for b in range(len(mask_BS)) if mask_BS[b].any()]
    loss, grad_BS = 0.0, np.zeros(logp_BS.shape)
    for b in rows:
        tokens = np.flatnonzero(mask_BS[b])
        w = 1.0 / (len(rows) * len(tokens))
        a = advantages_B[b]
        for t in tokens:
            r = np.exp(logp_BS[b, t] - logp_old_BS[b, t])
            if a > 0:
                loss += w * -a * min(r, 1 + clip)
                grad_BS[b, t] = -w * a * r if r < 1 + clip else 0.0
            elif a < 0:
                loss += w * -a * max(r, 1 - clip)
                grad_BS[b, t] = -w * a * r if r > 1 - clip else 0.0
    return loss, grad_BS


def logits_cotangent(grad_BS, probs_BSV, tokens_BT, temperature: float) -> np.ndarray:
    """``∂L/∂logits [B, T, V]`` from ``∂L/∂ℓ``: ``g · (onehot(target) - p) / T`` at positions
    ``0..T-2``, and 0 at the last position, which predicts nothing."""
    B, S, V = probs_BSV.shape
    out_BTV = np.zeros((B, S + 1, V))
    for b in range(B):
        for t in range(S):
            onehot = np.zeros(V)
            onehot[tokens_BT[b, t + 1]] = 1.0
            out_BTV[b, t] = grad_BS[b, t] * (onehot - probs_BSV[b, t]) / temperature
    return out_BTV
