"""The numeric fixtures of the objectives spec (§6), with NaN/Inf in every padded slot."""

from __future__ import annotations

import numpy as np

NAN, INF = np.nan, np.inf

# Fixture F: one group of G = 4 responses, padded width T = 4, L_max = 4, R = [1, 0, 0, 1].
F_MASK = np.array(
    [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=bool
)
F_REWARDS = np.array([1.0, 0.0, 0.0, 1.0])
F_LOGP_OLD = np.array(
    [
        [-1.0, -0.5, -2.0, NAN],
        [-0.7, -1.2, NAN, INF],
        [-0.3, -1.5, -0.9, -2.2],
        [-1.1, -INF, NAN, NAN],
    ]
)
F_DELTA = np.array(
    [
        [0.10, 0.22, -0.05, 0.0],
        [-0.40, 0.20, 0.0, 0.0],
        [0.00, -0.10, 0.25, -0.30],
        [0.50, 0.0, 0.0, 0.0],
    ]
)
F_LOGP = np.where(F_MASK, F_LOGP_OLD + F_DELTA, INF)
F_LOGP_REF = np.array(
    [
        [-1.2, -0.6, -1.8, INF],
        [-0.9, -1.0, NAN, NAN],
        [-0.3, -1.4, -1.0, -2.0],
        [-1.3, NAN, -INF, NAN],
    ]
)
F_LENGTHS = F_MASK.sum(axis=1)  # [3, 2, 4, 1], Σ|o| = 10

# Fixture P (PPO): B = 2, T = 4, lengths [4, 3], scores [1, 0].
P_MASK = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=bool)
P_SCORES = np.array([1.0, 0.0])
P_LOGP_OLD = np.array([[-0.5, -1.0, -0.8, -1.2], [-0.9, -0.4, -1.1, NAN]])
P_LOGP_REF = np.array([[-0.6, -0.9, -0.8, -1.5], [-1.0, -0.4, -1.0, INF]])
P_VALUES_OLD = np.array([[0.4, 0.5, 0.6, 0.7], [0.3, 0.2, 0.1, NAN]])
P_DELTA = np.array([[0.1, -0.3, 0.15, 0.25], [1.2, -0.25, 0.1, 0.0]])
P_LOGP = np.where(P_MASK, P_LOGP_OLD + P_DELTA, NAN)
P_VALUES = np.array([[0.45, 0.90, 0.55, 0.75], [0.10, 0.25, 0.40, -INF]])


def padded(matrix_rows: list[list[float]], mask: np.ndarray) -> np.ndarray:
    """Spec-style ragged rows as a ``[B, T]`` array, 0 in padded slots."""
    out = np.zeros(mask.shape)
    for i, row in enumerate(matrix_rows):
        out[i, : len(row)] = row
    return out
