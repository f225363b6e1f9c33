"""Fixtures shared by the runtime tests."""

from __future__ import annotations

import pytest

import runtime.rundir  # noqa: F401  (the runtime tests open run directories by their path, as every rlx command does)
from tests.runtime.small_run import tiny_config, write_sums


@pytest.fixture(scope="session")
def small_run(tmp_path_factory):
    """(run directory, summary, config) of one finished small run (see ``small_run.py``).

    Tests must not modify it: copy the directory first.
    """
    from runtime.run import run

    root = tmp_path_factory.mktemp("small_run")
    write_sums(root / "sums.jsonl")
    config = tiny_config(str(root / "sums.jsonl"), str(tmp_path_factory.getbasetemp() / "warm_start"))
    out = str(root / "run")
    summary = run(config, out, progress=False, log=lambda m: None)
    return out, summary, config
