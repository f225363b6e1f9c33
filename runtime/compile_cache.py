"""JAX's persistent cache of compiled programs, for processes that compile the same programs again
and again: ``rlx worker``, and the hosts of ``rlx run``, ``resume``, ``replay`` and ``pretrain``.

A worker process compiles what its role needs every time it starts (the model's initializers,
the engine's prefill and decode, the train step): for the demo's small model about 10 s of CPU
per process, which ``rlx run`` in processes mode pays for every worker of every run and every
replacement of a dead one, and which the run's RL time counts. With the cache, a program compiled
once on this machine (same program, compile options, backend and jax/jaxlib versions: the cache
key) is loaded from disk instead: the executable XLA compiled, so its results are bit for bit those
of a fresh compilation. A resume after a crash, or a replay, then goes to work in seconds.

The cache lives in ``~/.cache/rlx/jax`` unless ``$JAX_COMPILATION_CACHE_DIR`` names another
directory; ``$JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` and ``$JAX_COMPILATION_CACHE_MAX_SIZE``, when
set, are kept as well.
"""

from __future__ import annotations

import os

DEFAULT_DIR = os.path.join("~", ".cache", "rlx", "jax")
# Small programs count too: the model's initializers are dozens of compilations of ~0.1 s each.
MIN_COMPILE_TIME_S = 0.0
# Least recently used entries go past this size (when the ``filelock`` package JAX needs for it is
# installed; without it the cache is not bounded).
MAX_BYTES = 2 << 30


def enable(directory: str | None = None) -> str:
    """Turn the persistent compilation cache on for this process (before its first compilation);
    returns the cache directory."""
    import jax

    env = os.environ
    path = env.get("JAX_COMPILATION_CACHE_DIR") or os.path.expanduser(directory or DEFAULT_DIR)
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in env:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_TIME_S)
    if "JAX_COMPILATION_CACHE_MAX_SIZE" not in env:
        try:
            import filelock  # noqa: F401 - JAX's cache evicts under its lock
        except ImportError:
            pass
        else:
            jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    return path


__all__ = ["DEFAULT_DIR", "enable"]
