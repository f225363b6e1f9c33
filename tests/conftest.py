"""Suite-wide test settings: a persistent JAX compilation cache and hypothesis profiles."""

from __future__ import annotations

import os
import pathlib

from hypothesis import HealthCheck, settings

_ROOT = pathlib.Path(__file__).resolve().parent.parent

# Compilations are cached across test processes and runs; tests use small shapes.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(_ROOT / ".jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# "ci" is the default; "nightly" runs many more examples: HYPOTHESIS_PROFILE=nightly scripts/test
settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.register_profile(
    "nightly",
    deadline=None,
    max_examples=2000,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
