"""Work longer than the lease timeout keeps its worker, and the run finishes with the same bits.

Before heartbeats named the work in hand, a generation longer than ``workers.lease_timeout_s``
left the in-process run with its only inference worker declared lost: it never asked again, and
the run hung. Each run here is a subprocess with a deadline, so a hang fails instead of blocking.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ledger import events as ev
from ledger import open_store
from tests.runtime import small_run

TINY = [*small_run.TINY, "run.steps=3", "eval.size=8"]
DEADLINE_S = 300


def rlx_run(out, cache_dir: str, *extra: str, env: dict | None = None) -> dict:
    sets = [a for s in [*TINY, f'pretrain.cache_dir="{cache_dir}"', *extra] for a in ("--set", s)]
    proc = subprocess.run([sys.executable, "-m", "runtime.cli", "run", "--out", str(out), "--no-progress", *sets],
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=DEADLINE_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        return json.load(f)


def lost_workers(out) -> list[ev.WorkerLost]:
    with open_store(str(out), readonly=True) as store:
        return [e for e in store.events("run") if isinstance(e, ev.WorkerLost)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("warm"))
    out = tmp_path_factory.mktemp("reference") / "run"
    return cache, rlx_run(out, cache, 'workers.mode="threads"')["final_digest"]


@pytest.mark.slow
def test_threads_with_a_lease_timeout_shorter_than_every_generation_finish(tmp_path, reference):
    cache, digest = reference
    out = tmp_path / "run"
    summary = rlx_run(out, cache, 'workers.mode="threads"', "workers.lease_timeout_s=0.01")
    assert summary["final_digest"] == digest
    assert lost_workers(out) == []


@pytest.mark.slow
def test_processes_whose_generation_and_step_outlast_the_lease_keep_their_workers(tmp_path, reference):
    cache, digest = reference
    out = tmp_path / "run"
    slow = "inference.generate@2:sleep=3,trainer.step@2:sleep=3"
    summary = rlx_run(out, cache, 'workers.mode="processes"', "workers.lease_timeout_s=1.0",
                      env={"RLX_FAILPOINTS": slow, "RLX_TEST_FAILPOINTS": "1"})
    assert summary["final_digest"] == digest
    assert lost_workers(out) == []
    with open_store(str(out), readonly=True) as store:
        events = store.events("run")
    # The step outlasting the lease was not handed to the trainer again: one train step each.
    assert sorted(e.step for e in events if isinstance(e, ev.TrainStepCompleted)) == [1, 2, 3]
