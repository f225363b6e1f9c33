"""Suite-wide test settings: strict JAX numerics, a persistent JAX compilation cache, hypothesis
profiles, and the PostgreSQL server named by RLX_TEST_POSTGRES_URL (one fresh schema per test)."""

from __future__ import annotations

import os
import pathlib
import uuid

import pytest
from hypothesis import HealthCheck, settings

from runtime import compile_cache  # imports no JAX

_ROOT = pathlib.Path(__file__).resolve().parent.parent

# Compilations are cached across test processes and runs; tests use small shapes.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(_ROOT / ".jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The size bound rlx's own processes give the cache (runtime.compile_cache): JAX keeps a bounded
# cache's entries with their access times, and a bounded writer cannot write into a directory that
# an unbounded one filled (its eviction looks for access times that are not there), so every
# process of the suite, and each rlx process it starts, bounds it the same way.
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(compile_cache.MAX_BYTES))

# Strict numerics: the package's JAX code must say what it means. Rank promotion "raise" rejects a
# broadcast between arrays of different ranks (a [B] vector meeting a [B, S] array lines up with
# the S axis, silently when B == S); only scalars broadcast implicitly. Dtype promotion "strict"
# rejects every implicit promotion between different dtypes (int with float, float32 with float64
# or bfloat16), the way a stray float64 or an integer count sneaks into a float32 loss; a Python
# float still takes a float array's dtype (not an int array's). Code casts explicitly to the dtype
# the standard promotion would pick (kernels.dtypes), so runs, which use JAX's defaults, compute
# the same bits. Third-party arithmetic (optax's int32 step counts with float rates) runs under
# standard promotion where it is called (runtime.trainer.step.standard_promotion). jax_debug_nans
# stays off: padded slots may hold NaN by design (the objectives spec, §1) and are selected away.
import jax  # noqa: E402 - after the environment above, which jax reads when it is imported

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")

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

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"


def postgres_url() -> str:
    return os.environ.get("RLX_TEST_POSTGRES_URL", DEFAULT_PG)


@pytest.fixture
def pg_url():
    """A URL whose search_path is a fresh, empty schema (dropped afterwards)."""
    psycopg = pytest.importorskip("psycopg")
    base = postgres_url()
    try:
        admin = psycopg.connect(base, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as e:
        pytest.skip(f"no PostgreSQL server answers at {base}: {str(e).strip().splitlines()[0]}")
    schema = "rlx_test_" + uuid.uuid4().hex[:12]
    admin.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in base else "?"
    try:
        yield f"{base}{sep}options=-csearch_path%3D{schema}"
    finally:
        admin.execute(f"DROP SCHEMA {schema} CASCADE")
        admin.close()


def pytest_collection_modifyitems(items):
    """The files with end-to-end (``slow``) tests first, each file's tests kept together and in
    order. ``scripts/test`` hands whole files to its two workers in this order
    (``--dist loadfile --no-loadscope-reorder``), so the short files fill the end of the run
    instead of one long end-to-end file starting last and running alone."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)  # stable: collection order otherwise
