"""``rlx controller`` given no token: it makes one, in a file only its user can read, which its
workers read with ``--token-file`` and its successor keeps; a call without it is refused. A run
the ledger holds is not continued under a config that differs from its logged one."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from ledger import open_store
from runtime._generated import rlx_controller_pb2 as pb
from runtime.controller.workers import INFERENCE
from runtime.service.client import ControllerClient

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RLX_TOKEN"}
    return {**env, "PYTHONPATH": ROOT}


def _rlx(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runtime.cli", *argv], capture_output=True, text=True, env=_env(),
                          timeout=timeout)


def _controller(tmp_path, *extra: str) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "controller", "--ledger", str(tmp_path / "l.db"),
                             "--params", str(tmp_path / "params"), "--listen", "127.0.0.1:0", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait()
        raise AssertionError(proc.stderr.read())
    return proc, json.loads(line)


def _stop(proc: subprocess.Popen) -> str:
    proc.kill()
    _, err = proc.communicate()
    return err


@pytest.mark.slow
def test_a_controller_given_no_token_makes_one_that_its_workers_and_its_successor_use(tmp_path):
    token_file = str(tmp_path / "controller.token")  # beside the SQLite ledger
    proc, line = _controller(tmp_path, "--steps", "1")
    try:
        assert line["token_file"] == token_file
        assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
        with open(token_file) as f:
            token = f.read().strip()
        assert len(token) >= 32
        refused = _rlx("worker", "inference", "--controller", line["listening"], "--retry-for", "5")
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert "UNAUTHENTICATED" in refused.stderr
        client = ControllerClient([line["listening"]], token=token)
        try:
            assert client.join("w", INFERENCE).standing == pb.JOINED
        finally:
            client.close()
    finally:
        err = _stop(proc)
    assert f"workers use the one in {token_file} (mode 0600)" in err and f"--token-file {token_file}" in err

    again, line = _controller(tmp_path)  # the successor: the same token, so the workers carry on
    try:
        assert line["epoch"] == 2 and line["token_file"] == token_file
        with open(token_file) as f:
            assert f.read().strip() == token
    finally:
        _stop(again)


def test_a_token_file_others_can_read_is_refused(tmp_path):
    path = tmp_path / "t.token"
    path.write_text("x" * 40 + "\n")
    os.chmod(path, 0o644)
    done = _rlx("controller", "--ledger", str(tmp_path / "l.db"), "--params", str(tmp_path / "params"),
                "--listen", "127.0.0.1:0", "--token-out", str(path), "--steps", "1")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"token file {str(path)!r} must be a regular file of this user that only they can read" in done.stderr
    assert sorted(os.listdir(tmp_path)) == ["t.token"]


def test_a_config_that_differs_from_the_logged_one_is_refused_and_changes_nothing(tmp_path):
    from runtime.config import load_config
    from runtime.controller import ControllerLoop
    from runtime.session import make_task, resolve

    config = load_config(None, ["run.steps=2"])
    config = resolve(config, make_task(config))  # as the controller that created it logged it
    with open_store(str(tmp_path / "l.db"), create=True) as store:
        ControllerLoop.create(store, run_id="run", config=config.to_dict(), config_digest=config.digest(), seed=0)
        events = len(list(store.read("run")))
    done = _rlx("controller", "--ledger", str(tmp_path / "l.db"), "--params", str(tmp_path / "params"),
                "--listen", "127.0.0.1:0", "--steps", "3", "--set", "sampling.temperature=0.5")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert ("run 'run' is in the ledger already and goes on with its logged config, which the config given differs "
            "from: run.steps (logged 2, given 3), sampling.temperature (logged 1.0, given 0.5); give the same config, "
            "or none") in done.stderr
    with open_store(str(tmp_path / "l.db"), readonly=True) as store:
        assert len(list(store.read("run"))) == events
    assert not (tmp_path / "params").exists() and not (tmp_path / "controller.token").exists()
