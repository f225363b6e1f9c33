"""A writer process for the parameter-store crash and concurrency tests.

``write_versions`` runs in a child process: it publishes versions ``first, first + 1, …`` of
``make_params``/``make_opt_state``, optionally applies retention after each, and appends each
published version to a log file with one small ``os.write``, so a SIGKILL leaves only whole
lines behind.
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np

from runtime.params import ParamStore


def make_params(version: int, *, leaves: int = 4, width: int = 64) -> dict:
    """Deterministic parameters of ``version``: float32, bfloat16 and int32 leaves."""
    rng = np.random.default_rng(version)
    layers = {}
    for i in range(leaves):
        layers[f"layer_{i}"] = {
            "kernel": rng.standard_normal((width, width), dtype=np.float32),
            "bias": rng.standard_normal(width, dtype=np.float32).astype(ml_dtypes.bfloat16),
        }
    return {"layers": layers, "embed": rng.integers(-9, 9, (16, width), dtype=np.int32)}


def make_opt_state(version: int, params: dict) -> tuple:
    """An optax-shaped state: (count scalar, first moments like params)."""
    moments = {"layers": params["layers"], "embed": params["embed"].astype(np.float32) * 0.5}
    return (np.int32(version), moments)


def write_versions(
    url: str, log_path: str, first: int, count: int, keep_newest: int | None = None
) -> None:
    store = ParamStore.open(url, create=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for version in range(first, first + count):
        params = make_params(version)
        store.put(version, params, make_opt_state(version, params))
        os.write(fd, f"{version}\n".encode())
        if keep_newest is not None:  # like a run's retirements: version 0 and the newest stay
            for old in store.versions()[1:-keep_newest]:
                store.delete(old)
    os.close(fd)
