"""``rlx ledger export --format parquet``: the Parquet tables read back (pyarrow) with the JSON
export's rows, values and dtypes, through explicit schemas."""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from ledger.pipelines.columnar import JSON_COLUMNS, SCHEMAS
from runtime.cli import main
from tests.ledger.test_pipelines import _ledger, _rows
from tests.runtime.controller.golden.regenerate import HERE, load


@pytest.mark.slow
def test_parquet_tables_hold_the_json_rows(tmp_path, capsys):
    path = _ledger(tmp_path, load(HERE / "deterministic_k0_filtered.msgpack"))
    js, pa_out = str(tmp_path / "json"), str(tmp_path / "parquet")
    assert main(["ledger", "export", path, "--out", js]) == 0
    assert main(["ledger", "export", path, "--out", pa_out, "--format", "parquet", "--json"]) == 0
    counts = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    keys = {"rollouts": "rollout_id", "versions": "version", "steps": "step"}
    for name, schema in SCHEMAS.items():
        files = sorted(glob.glob(os.path.join(pa_out, f"{name}-*.parquet")))
        table = pq.ParquetDataset(files).read()
        assert table.schema.remove_metadata().equals(schema)
        got = sorted(table.to_pylist(), key=lambda r: r[keys[name]])
        want = sorted(_rows(js, name), key=lambda r: r[keys[name]])
        assert len(got) == len(want) == counts[name] > 0
        for g, w in zip(got, want, strict=True):
            for col in JSON_COLUMNS & set(g):
                g[col] = None if g[col] is None else json.loads(g[col])
            assert set(w) <= set(g)
            assert {k: g[k] for k in w} == w, (name, w[keys[name]])
    rollouts = pq.ParquetDataset(sorted(glob.glob(os.path.join(pa_out, "rollouts-*.parquet")))).read()
    tokens = rollouts.column("token_ids").combine_chunks().flatten().to_numpy()
    assert tokens.dtype == np.int32 and len(tokens) > 0
    assert rollouts.column("logprobs").type.value_type == "float"
