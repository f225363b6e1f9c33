"""Explicit pyarrow schemas of the export's tables, for ``rlx ledger export --format parquet``.

Scalars are typed columns (ids, seqs and counts ``int64``, rates and rewards ``float64``,
digests and names ``string``), all nullable where the JSON row may hold null. Token ids are
``list<int32>`` and log-probabilities ``list<float32>``, the dtypes the ledger stores, so they
read back bit for bit; other lists (``abandoned``, ``policy_versions``) are list columns. The
dict-valued fields whose keys vary by config or algorithm (``sampling`` of a rollout, ``metrics``
of a step) are JSON strings (``json.loads`` gives the JSON export's value).
"""

from __future__ import annotations

import pyarrow as pa

from ledger.errors import LedgerError
from ledger.pipelines import jsonl

JSON_COLUMNS = frozenset({"sampling", "metrics", "turns"})
"""Columns holding a JSON text of the row's dict."""

ROLLOUTS = pa.schema([
    ("run_id", pa.string()), ("rollout_id", pa.int64()), ("group_id", pa.int64()), ("batch", pa.int64()),
    ("ordinal", pa.int64()), ("prompt_index", pa.int64()), ("policy_version", pa.int64()), ("seed", pa.int64()),
    ("sampling", pa.string()), ("requested_seq", pa.int64()), ("attempts", pa.int64()),
    ("abandoned", pa.list_(pa.string())), ("worker", pa.string()), ("attempt", pa.int64()),
    ("weights_digest", pa.string()), ("token_ids", pa.list_(pa.int32())), ("logprobs", pa.list_(pa.float32())),
    ("finish_reason", pa.string()), ("turns", pa.string()), ("completed_seq", pa.int64()), ("tokens", pa.int64()), ("reward", pa.float64()),
    ("passed", pa.bool_()), ("verdict", pa.string()), ("verifier", pa.string()), ("verifier_version", pa.string()),
    ("detail", pa.string()), ("consumed_by_step", pa.int64()), ("staleness", pa.int64()),
    ("produced_version", pa.int64()), ("produced_digest", pa.string()), ("discarded", pa.string()),
    ("prompt", pa.string()), ("completion", pa.string()),
])
"""One row per rollout; ``prompt`` and ``completion`` are null when the export adds no text."""

VERSIONS = pa.schema([
    ("run_id", pa.string()), ("version", pa.int64()), ("digest", pa.string()), ("rollouts", pa.int64()),
    ("completed", pa.int64()), ("scored", pa.int64()), ("passed", pa.int64()), ("pass_rate", pa.float64()),
    ("mean_reward", pa.float64()), ("mean_tokens", pa.float64()), ("consumed", pa.int64()),
    ("discarded", pa.int64()),
])

STEPS = pa.schema([
    ("run_id", pa.string()), ("step", pa.int64()), ("batch_seq", pa.int64()), ("groups", pa.int64()),
    ("rollouts", pa.int64()), ("policy_versions", pa.list_(pa.int64())), ("staleness_max", pa.int64()),
    ("staleness_mean", pa.float64()), ("parent_digest", pa.string()), ("trained_seq", pa.int64()),
    ("metrics", pa.string()), ("produced_digest", pa.string()),
])

SCHEMAS = {"rollouts": ROLLOUTS, "versions": VERSIONS, "steps": STEPS}


def to_record(row: dict, schema: pa.Schema) -> dict:
    """``row`` with every column of ``schema`` (absent ones null) and dicts as JSON text; a key
    the schema lacks is an error, so a new row field cannot vanish from the Parquet export."""
    extra = sorted(set(row) - set(schema.names))
    if extra:
        raise LedgerError(f"row fields {extra} have no Parquet column; add them to ledger/pipelines/columnar.py")
    out = {}
    for name in schema.names:
        v = row.get(name)
        out[name] = jsonl.dumps(v) if name in JSON_COLUMNS and v is not None else v
    return out
