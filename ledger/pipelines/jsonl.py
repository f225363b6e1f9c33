"""JSON text of export rows: valid JSON always, whatever floats the ledger holds.

JSON has no NaN or infinity (``json.dumps`` writes the non-standard ``NaN``, which strict
readers refuse). A float that is not finite — a log-prob or metric of a ledger written before
submissions were checked — is written as ``null``, as JavaScript's ``JSON.stringify`` does; the
Parquet export keeps such values in its float columns.
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite(value: Any) -> Any:
    """``value`` with every non-finite float, at any depth of lists, tuples and dicts, as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(value: Any) -> str:
    """``value`` as one line of strict JSON with sorted keys (non-finite floats as null)."""
    return json.dumps(finite(value), sort_keys=True, allow_nan=False)
