"""Processes that need the same warm start at once (a run's host and its workers, on a cold cache)
take turns on its lock: one trains it, the others say they wait and then load its copy."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import time

from tests.runtime import small_run as small


def test_a_second_process_waits_for_the_warm_start_and_loads_it(tmp_path):
    small.write_sums(tmp_path / "sums.jsonl")
    argv = [sys.executable, "-m", "runtime.cli", "pretrain", "--data", str(tmp_path / "sums.jsonl"), "--steps", "12",
            *[x for o in [*small.TINY[1:], f'pretrain.cache_dir="{tmp_path / "cache"}"'] for x in ("--set", o)]]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "400"}
    first = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    path = re.search(r"kept in (\S+) for the next run", first.stdout).group(1)
    assert os.path.isfile(os.path.join(path, "config.json"))
    shutil.move(path, str(tmp_path / "trained"))  # as if the first were still training it
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        second = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        assert second.stdout is not None
        said = []
        deadline = time.monotonic() + 300
        while not any("waiting for its copy" in line for line in said):
            line = second.stdout.readline()
            assert line and time.monotonic() < deadline, said
            said.append(line)
        assert said[-1].startswith(f"warm start: another process is training it; waiting for its copy ({path})")
        shutil.move(str(tmp_path / "trained"), path)  # the other process's copy is in place; it lets go
        fcntl.flock(lock, fcntl.LOCK_UN)
    rest = second.stdout.read()
    assert second.wait(timeout=300) == 0
    assert "warm start: loading 12 supervised steps from the cache" in rest
    assert "checkpoint (loaded from the cache)" in rest and "training" not in rest
