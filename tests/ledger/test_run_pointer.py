"""A run directory whose ledger lives elsewhere names it in ``ledger.json``; the ledger itself
knows no run directory (``runtime.rundir`` lets it take one)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ledger import StoreUnavailable, open_store
from ledger.url import resolve_url
from runtime.rundir import pointed_run, run_pointer, write_run_pointer


def test_a_pointer_resolves_the_directory_to_its_ledger(tmp_path):
    elsewhere = tmp_path / "elsewhere.db"
    with open_store(str(elsewhere), create=True) as store:
        store.create_run("mine")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert resolve_url(run_dir) == "sqlite:///" + str(run_dir / "ledger.db") and pointed_run(run_dir) is None
    write_run_pointer(run_dir, str(elsewhere), "mine")
    assert run_pointer(run_dir) == {"url": "sqlite:///" + str(elsewhere), "run_id": "mine"}
    assert resolve_url(run_dir) == "sqlite:///" + str(elsewhere) and pointed_run(run_dir) == "mine"
    with open_store(run_dir) as store:
        assert store.runs() == ["mine"]
    assert pointed_run(str(elsewhere)) is None and pointed_run("postgresql://x/y") is None
    with open_store(run_dir / "ledger.db", create=True):  # a ledger of its own takes precedence
        pass
    assert resolve_url(run_dir) == "sqlite:///" + str(run_dir / "ledger.db") and pointed_run(run_dir) is None


@pytest.mark.parametrize("text", ["not json", '{"url": 3, "run_id": "r"}', '{"run_id": "r"}',
                                  '{"url": "relative/path.db", "run_id": "r"}'])
def test_a_bad_pointer_is_one_clear_error(tmp_path, text):
    (tmp_path / "ledger.json").write_text(text)
    with pytest.raises(StoreUnavailable, match="ledger.json does not point to a ledger"):
        resolve_url(tmp_path)
    assert os.listdir(tmp_path) == ["ledger.json"]


def test_without_runtime_a_directory_is_not_a_ledger(tmp_path):
    """``ledger`` alone takes a directory for a SQLite file, which the store refuses in one line."""
    code = ("import sys; from ledger import StoreUnavailable, open_store\n"
            "try:\n    open_store(sys.argv[1])\nexcept StoreUnavailable as e:\n    print(e)\n"
            "assert 'runtime' not in sys.modules")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"{tmp_path} is a directory, not a ledger file"
