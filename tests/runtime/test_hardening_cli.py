"""Careless inputs to every ``rlx`` command, through the real console script: each is refused in
one line on stderr (``rlx: error: …``, naming the bad value), exit status 2, no traceback, no
hang, and nothing is created or changed — no run directory, ledger, parameter store or token.

Bad paths (``/proc``, symbolic links, files where directories are expected), NaN, infinite,
negative and huge numbers for numeric flags, bad ``--set`` values and bad environment values.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from ledger import open_store
from runtime.rundir import RunDir
from tests.ledger.simulated import write_simulated_run

RLX = os.path.join(os.path.dirname(sys.executable), "rlx")
SWITCHED = {"RLX_TEST_FAILPOINTS": "1"}
FAST = ("--set pretrain.steps=0 --set model.hidden_size=16 --set model.num_layers=1 --set model.num_heads=1 "
        "--set model.num_kv_heads=1 --set model.intermediate_size=16")
CTRL = "controller --ledger {tmp}/c.db --params {tmp}/p"

# (command line, extra environment, a part of the one line the refusal must be)
CASES = [
    # run: output paths
    ("run --out /proc/x --steps 1", {}, "--out '/proc/x' cannot be written: '/proc' takes no new files"),
    ("run --out {tmp}/link --steps 1", {}, "--out '{tmp}/link' is a symbolic link (to '{tmp}/dir')"),
    ("run --out {tmp}/dangling --steps 1", {}, "--out '{tmp}/dangling' is a symbolic link"),
    ("run --out {tmp}/file --steps 1", {}, "exists and is not a directory"),
    ("run --out {tmp}/file/sub --steps 1", {}, "cannot be created: '{tmp}/file' is not a directory"),
    # run: numbers and --set values
    ("run --out {tmp}/o --steps -1", {}, "run.steps: -1 is not accepted"),
    ("run --out {tmp}/o --steps 99999999999999999999999", {}, "it must be an integer from 1 to 1000000000"),
    ("run --out {tmp}/o --seed -1", {}, "run.seed: -1 is not accepted"),
    ("run --out {tmp}/o --seed 99999999999999999999999", {}, "it must be an integer in [0, 2**63)"),
    ("run --out {tmp}/o --steps nan", {}, "argument --steps: invalid int value: 'nan'"),
    ("run --out {tmp}/o --set run.steps=nan", {}, "run.steps: nan is not accepted"),
    ("run --out {tmp}/o --set sampling.temperature=nan", {}, "it must be a finite number"),
    ("run --out {tmp}/o --set sampling.temperature=inf", {}, "it must be a finite number"),
    ("run --out {tmp}/o --set trainer.learning_rate=-1", {}, "trainer.learning_rate: -1.0 is not accepted"),
    ("run --out {tmp}/o --set garbage", {}, "override: 'garbage' is not accepted"),
    ("run --out {tmp}/o --set run.nosuch=1", {}, "run field: 'nosuch' is not accepted"),
    ("run --out {tmp}/o --data /proc/x", {}, "data file '/proc/x' does not exist"),
    ("run --out {tmp}/o --model {tmp}/dir", {}, "is not a Hugging Face checkpoint directory"),
    # run: what would stop a recorded run is refused before it is recorded
    ('run --out {tmp}/o --steps 1 --set log.tensorboard="/proc/x"', {},
     "log.tensorboard '/proc/x' cannot be written: '/proc' takes no new files"),
    ("run --out {tmp}/o --steps 1 --set trainer.mesh={{data=64}} " + FAST, {},
     "trainer takes 64 devices (trainer.mesh) but this host has 1 cpu; on CPU, "
     "XLA_FLAGS=--xla_force_host_platform_device_count=64 gives it as many"),
    # the environment, for every command
    ("run --out {tmp}/o --steps 1", {"RLX_FAILPOINTS": "garbage", **SWITCHED}, "RLX_FAILPOINTS item 'garbage'"),
    ("ledger stats {run}", {"RLX_FAILPOINTS": "x@0", **SWITCHED}, "RLX_FAILPOINTS item 'x@0' is not accepted"),
    ("verify math --gold 1 --answer 1", {"RLX_FAILPOINTS": "x@1:sleep=nan", **SWITCHED}, "item 'x@1:sleep=nan'"),
    ("ledger stats {run}", {"RLX_TEST_FAILPOINTS": "yes"}, "RLX_TEST_FAILPOINTS='yes' is not accepted"),
    # resume and pretrain
    ("resume /proc/x", {}, "no ledger at /proc/x/ledger.db"),
    ("resume {tmp}/file", {}, "no ledger at"),
    ("pretrain --out /proc/x --steps 1", {}, "--out '/proc/x' cannot be written"),
    ("pretrain --out {tmp}/link --steps 1", {}, "is a symbolic link"),
    ("pretrain --steps -1", {}, "pretrain.steps: -1 is not accepted"),
    # ledger tools
    ("ledger verify /proc/x", {}, "no ledger at /proc/x"),
    ("ledger tail {run} --from -1", {}, "argument --from: '-1' is not accepted; give an integer from 1"),
    ("ledger tail {run} -n -5", {}, "-n -5 is not accepted"),
    ("ledger export {run} --out /proc/x", {}, "--out '/proc/x' cannot be written"),
    ("ledger export {run} --out {tmp}/link", {}, "is a symbolic link"),
    ("ledger export {run} --out {tmp}/o --range-events -5", {}, "(--range-events) must be >= 1, got -5"),
    # verify and serve
    ("verify math --gold 1 --answer 1 --timeout nan", {}, "--timeout nan must be a number of seconds"),
    ("verify math --gold 1 --answer 1 --timeout inf", {}, "--timeout inf must be a number of seconds"),
    ("verify math --gold 1 --answer 1 --rel-tol nan", {}, "--rel-tol 'nan' must be"),
    ("verify code --program /proc/x --tests {tmp}/file", {}, "cannot read program '/proc/x'"),
    ("verify code --program {tmp}/file --tests {tmp}/file --memory-mb -1", {}, "--memory-mb -1 must be"),
    ("serve verifier --port 99999", {}, "port 99999 must be an integer in 0..65535"),
    ("serve verifier --port -1", {}, "port -1 must be an integer in 0..65535"),
    ("serve verifier --port {busy}", {}, "cannot listen on 127.0.0.1:{busy}: the port is in use"),
    ("serve verifier --port 0 --max-wall-s nan", {}, "--max-wall-s nan must be"),
    # workers
    ("worker inference --controller 127.0.0.1:99999", {}, "--controller '127.0.0.1:99999' is not HOST:PORT"),
    ("worker inference --controller 127.0.0.1:0", {}, "--controller '127.0.0.1:0' is not HOST:PORT"),
    ("worker inference --controller 127.0.0.1:1 --retry-for nan", {}, "argument --retry-for: 'nan' is not accepted"),
    ("worker inference --controller 127.0.0.1:1 --retry-for inf", {}, "argument --retry-for: 'inf' is not accepted"),
    ("worker inference --controller 127.0.0.1:1 --retry-for -1", {}, "argument --retry-for: '-1' is not accepted"),
    ("worker trainer --controller 127.0.0.1:1 --gang 0/2 --coordinator 127.0.0.1:99999", {},
     "--coordinator '127.0.0.1:99999' is not"),
    ("worker trainer --controller 127.0.0.1:1 --gang 0/2 --coordinator 127.0.0.1:0", {},
     "--coordinator '127.0.0.1:0' is not"),
    # the controller: arguments, stores and its address, before the ledger or the run is created
    (CTRL + " --listen 127.0.0.1:99999", {}, "port 99999 must be an integer in 0..65535"),
    (CTRL + " --listen 127.0.0.1:{busy} --steps 1", {}, "cannot listen on 127.0.0.1:{busy}: the port is in use"),
    (CTRL + " --listen 127.0.0.1:0 --steps -1", {}, "run.steps: -1 is not accepted"),
    (CTRL + " --listen 127.0.0.1:0 --set garbage", {}, "override: 'garbage' is not accepted"),
    (CTRL + " --listen 127.0.0.1:0 --data /proc/x", {}, "data file '/proc/x' does not exist"),
    (CTRL + " --listen 127.0.0.1:0 --token-file /proc/x", {}, "cannot read token file '/proc/x'"),
    (CTRL + " --listen 127.0.0.1:0 --token-out /proc/x", {}, "cannot write the controller's token to '/proc/x'"),
    ("controller --ledger /proc/x --params {tmp}/p --listen 127.0.0.1:0", {}, "--ledger '/proc/x' cannot be written"),
    ("controller --ledger {tmp}/c.db --params /proc/x --listen 127.0.0.1:0", {}, "--params '/proc/x' cannot be"),
    ("controller --ledger {tmp}/c.db --params {tmp}/link --listen 127.0.0.1:0", {}, "is a symbolic link"),
    # replay, audit, curate, export
    ("replay /proc/x", {}, "'/proc/x' is not a run directory"),
    ("replay {run} --from-version -1", {}, "argument --from-version: '-1' is not accepted"),
    ("audit {run} version -1", {}, "version -1 is not in this run"),
    ("audit {run} rollout 99999999999999999999999", {}, "rollout 99999999999999999999999 is not in this run"),
    ("curate {run} --out /proc/x", {}, "--out '/proc/x' cannot be written"),
    ("curate {run} --out {tmp}/c.jsonl --min-pass nan", {}, "--min-pass nan is not accepted"),
    ("curate {run} --out {tmp}/c.jsonl --versions x:y", {}, "--versions 'x:y' is not accepted"),
    ("curate {run} --out {tmp}/link --force", {}, "is a symbolic link"),
    ("export {run} --version -1 --out {tmp}/e", {}, "--version -1: versions are integers >= 0"),
    ("export {run} --version 0 --out /proc/x", {}, "--out '/proc/x' cannot be written"),
    ("export {run} --version 0 --out {tmp}/link", {}, "is a symbolic link"),
    ("export {run} --version 0 --out {tmp}/e --max-shard-size nan", {}, "'nan' is not a size"),
]


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """A directory holding a run (a simulated ledger), a directory, a file, a link to the
    directory, a dangling link; and a port in use."""
    root = tmp_path_factory.mktemp("careless")
    (root / "run").mkdir()
    with open_store(RunDir(root / "run").ledger, create=True) as store:
        write_simulated_run(store)
    (root / "dir").mkdir()
    (root / "file").write_text("x")
    os.symlink(root / "dir", root / "link")
    os.symlink(root / "nowhere", root / "dangling")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        yield root, busy.getsockname()[1]


def _listing(root) -> list[str]:
    # SQLite's shared-memory files come and go with any reader: they are not a created ledger.
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, ds, fs in os.walk(root) for f in [*fs, *ds]
                  if not f.endswith(("-wal", "-shm")))


def _lanes(cases):
    """Each command's first case in the fast lane, the rest marked slow (each case is a process)."""
    seen: set[str] = set()
    for argv, env, message in cases:
        command = argv.split()[0]
        marks = () if command not in seen else (pytest.mark.slow,)
        seen.add(command)
        yield pytest.param(argv, env, message, marks=marks, id=f"{argv[:60]}{' ' + str(env) if env else ''}")


@pytest.mark.parametrize("argv, env, message", list(_lanes(CASES)))
def test_a_careless_input_is_one_line_and_creates_nothing(place, argv, env, message):
    root, busy = place
    fill = {"tmp": str(root), "run": str(root / "run"), "busy": busy}
    base = {k: v for k, v in os.environ.items() if k not in ("RLX_TOKEN", "RLX_FAILPOINTS", "RLX_TEST_FAILPOINTS")}
    before = _listing(root)
    started = time.monotonic()
    done = subprocess.run([RLX, *argv.format(**fill).split()], cwd=root, env={**base, **env}, capture_output=True,
                          text=True, timeout=120)
    took = time.monotonic() - started
    err = done.stderr
    assert done.returncode == 2, (done.returncode, err[-2000:])
    assert err.startswith("rlx: error: ") and err.count("\n") == 1 and "Traceback" not in err, err[-2000:]
    assert message.format(**fill) in err, err
    assert _listing(root) == before
    assert took < 60, f"refused after {took:.0f} s"
