"""Ledger test fixtures: the PostgreSQL server named by RLX_TEST_POSTGRES_URL, one schema per test."""

from __future__ import annotations

import os
import uuid

import pytest

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
