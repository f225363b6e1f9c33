"""The supervisor of ``rlx run``: a worker that keeps dying without delivering stops the run
with one line naming it; the command lines of the workers read ``rlx worker ROLE``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from runtime.service.supervisor import describe_exit, rlx_command
from tests.runtime.service.test_liveness import DEADLINE_S, TINY


def test_exit_descriptions_name_the_signal_or_code():
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(3) == "exit code 3"


def test_workers_are_started_as_rlx_worker():
    cmd = rlx_command()
    assert cmd[-1].endswith("rlx") or cmd[-2:] == ["-m", "runtime.cli"]


@pytest.mark.slow
def test_a_worker_that_always_crashes_stops_the_run_with_one_line(tmp_path):
    out = tmp_path / "run"
    sets = [a for s in [*TINY, f'pretrain.cache_dir="{tmp_path / "warm"}"'] for a in ("--set", s)]
    proc = subprocess.run([sys.executable, "-m", "runtime.cli", "run", "--out", str(out), "--no-progress", *sets],
                          env={**os.environ, "RLX_FAILPOINTS": "inference.generate@1", "RLX_TEST_FAILPOINTS": "1"}, capture_output=True, text=True,
                          timeout=DEADLINE_S)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("rlx: error: the inference worker inference-0 died 5 times in a row"), last
    assert "killed by SIGKILL" in last and "Traceback" not in proc.stderr
    with open(out / "workers.jsonl", encoding="utf-8") as f:
        journal = [json.loads(line) for line in f]
    spawns = [e for e in journal if e["event"] == "spawn" and e["role"] == "inference"]
    assert [e["worker_id"] for e in spawns] == [f"inference-0.{i}" for i in range(1, 6)]
    # Every worker process is gone with the run.
    for e in journal:
        if e["event"] == "spawn":
            assert not os.path.exists(f"/proc/{e['pid']}") or _zombie_or_other(e["pid"])


def _zombie_or_other(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"worker" not in f.read()
    except OSError:
        return True
