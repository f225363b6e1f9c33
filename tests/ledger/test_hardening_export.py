"""``rlx ledger export`` of a ledger written before submissions were checked: a negative or
out-of-vocabulary token id and non-finite floats export as valid JSON (the completion's text
None, the floats null), never a crash or a ``NaN`` in the file."""

from __future__ import annotations

import dataclasses
import glob
import json
import os

import numpy as np

from ledger import events as ev
from runtime.cli import main
from tests.ledger.test_pipelines import _ledger
from tests.runtime.controller.golden.regenerate import HERE, load


def _strict(line: str):
    def refuse(constant: str):
        raise AssertionError(f"{constant} is not JSON: {line[:200]}")

    return json.loads(line, parse_constant=refuse)


def test_a_poisoned_rollout_and_metric_export_as_valid_json(tmp_path, capsys):
    events = load(HERE / "deterministic_k0_filtered.msgpack")
    i = next(i for i, e in enumerate(events) if isinstance(e, ev.RolloutCompleted))
    poisoned = dataclasses.replace(events[i], tokens=np.array([-1, 2**31 - 1, 3], np.int32),
                                   logprobs=np.array([np.nan, -np.inf, -0.5], np.float32))
    events[i] = poisoned
    j = next(j for j, e in enumerate(events) if isinstance(e, ev.TrainStepCompleted))
    events[j] = dataclasses.replace(events[j], metrics={**events[j].metrics, "loss": float("nan")})
    path = _ledger(tmp_path, events)
    out = str(tmp_path / "out")

    assert main(["ledger", "export", path, "--out", out]) == 0
    assert "Traceback" not in capsys.readouterr().err
    rows = {}
    for name in ("rollouts", "versions", "steps"):
        rows[name] = []
        for f in sorted(glob.glob(os.path.join(out, f"{name}-*.jsonl"))):
            with open(f) as fh:
                rows[name].extend(_strict(line) for line in fh)
    row = next(r for r in rows["rollouts"] if r["rollout_id"] == poisoned.rollout_id)
    assert row["token_ids"] == [-1, 2**31 - 1, 3] and row["logprobs"] == [None, None, -0.5]
    assert row["completion"] is None  # ids outside the vocabulary have no text
    step = next(r for r in rows["steps"] if r["step"] == events[j].step)
    assert step["metrics"]["loss"] is None and step["metrics"]["reward_mean"] == events[j].metrics["reward_mean"]
    assert len(rows["versions"]) == 4
