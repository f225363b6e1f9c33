"""A deployment as it spans machines, on loopback: ``rlx controller`` on a PostgreSQL ledger and
separate ``rlx worker`` processes, every one a process of its own. The controller is replaced
mid-run — killed and restarted on its port, or paused while another takes over (the zombie) —
and the run still ends with the digest of an uninterrupted threads-mode ``rlx run`` of the same
config, with a ledger that verifies and audits clean.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from ledger import events as ev
from ledger import open_store
from runtime.rundir import write_run_pointer
from tests.runtime import small_run

STEPS = 5
TINY = small_run.TINY
ROLES = ("inference", "verifier", "trainer")
WAIT_S = 240.0  # the longest any one phase may take on a loaded machine


def rlx_argv(*argv: str) -> list[str]:
    return [sys.executable, "-m", "runtime.cli", *argv]


def settings(cache_dir: str) -> list[str]:
    out: list[str] = []
    for o in [*TINY, f'pretrain.cache_dir="{cache_dir}"']:
        out += ["--set", o]
    return out


def environment() -> dict:
    """The children's environment: this tree's code, no token (they listen on loopback)."""
    env = {k: v for k, v in os.environ.items() if k != "RLX_TOKEN"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("warm_start"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache_dir) -> str:
    """The final digest of an uninterrupted threads-mode ``rlx run`` of the deployment's config."""
    out = str(tmp_path_factory.mktemp("reference") / "run")
    done = subprocess.run(rlx_argv("run", "--out", out, "--no-progress", "--steps", str(STEPS),
                                   *settings(cache_dir), "--set", 'workers.mode="threads"'),
                          capture_output=True, text=True, env=environment(), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)["final_digest"]


class Controller:
    """An ``rlx controller`` process; its stdout lines (JSON) arrive on a queue."""

    def __init__(self, deployment: Deployment, port: int, name: str):
        self.name = name
        self.log = os.path.join(deployment.dir, f"{name}.log")
        argv = rlx_argv("controller", "--ledger", deployment.ledger, "--params", deployment.params,
                        "--listen", f"127.0.0.1:{port}", "--run", deployment.run, "--steps", str(STEPS),
                        "--token-out", deployment.token_file, *settings(deployment.cache_dir))
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, env=environment())
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.listening = self.line()
        assert self.listening["listening"] == f"127.0.0.1:{port}" and self.listening["run"] == deployment.run
        self.epoch = self.listening["epoch"]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def line(self, timeout: float = WAIT_S) -> dict:
        line = self.lines.get(timeout=timeout)
        assert line is not None, f"controller {self.name} ended without a line:\n{self.stderr()}"
        return json.loads(line)

    def stderr(self) -> str:
        with open(self.log) as f:
            return f.read()


class Deployment:
    """A run served by ``rlx controller`` processes on a PostgreSQL ledger (a schema of its own),
    a parameter store in a directory, and one worker process of each role."""

    def __init__(self, tmp_path, pg_url: str, cache_dir: str):
        self.dir = str(tmp_path)
        self.ledger, self.cache_dir = pg_url, cache_dir
        self.params = "file://" + os.path.join(self.dir, "params")
        self.run = "deploy-" + uuid.uuid4().hex[:8]
        self.token_file = os.path.join(self.dir, "controller.token")  # made by the first controller, kept
        self.controllers: list[Controller] = []
        self.workers: dict[str, subprocess.Popen] = {}

    def controller(self, port: int) -> Controller:
        c = Controller(self, port, f"controller-{len(self.controllers)}")
        self.controllers.append(c)
        return c

    def start_workers(self, targets: list[int]) -> None:
        address = ",".join(f"127.0.0.1:{p}" for p in targets)
        # Step 2 takes 4 s longer (its lease is kept by heartbeats): after step 1 the run is
        # surely mid-way when the test replaces the controller, however fast the steps are.
        slow = {"trainer": {"RLX_FAILPOINTS": "trainer.step@2:sleep=4", "RLX_TEST_FAILPOINTS": "1"}}
        for role in ROLES:
            with open(os.path.join(self.dir, f"{role}.log"), "w") as log:
                self.workers[role] = subprocess.Popen(
                    rlx_argv("worker", role, "--controller", address, "--worker-id", f"{role}-0",
                             "--token-file", self.token_file),
                    stdout=log, stderr=subprocess.STDOUT, env={**environment(), **slow.get(role, {})})

    def events(self) -> list:
        with open_store(self.ledger) as store:
            return list(store.read(self.run)) if self.run in store.runs() else []

    def wait_for(self, what: str, predicate) -> list:
        """The ledger's events once ``predicate(events)`` holds."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            events = self.events()
            if predicate(events):
                return events
            for c in self.controllers:
                if c.proc.poll() not in (None, -signal.SIGKILL):
                    raise AssertionError(f"controller {c.name} exited with {c.proc.returncode} while waiting for "
                                         f"{what}:\n{c.stderr()[-3000:]}\n{self.logs()}")
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}\n{self.logs()}")

    def logs(self) -> str:
        out = []
        for name in [*ROLES, *(c.name for c in self.controllers)]:
            path = os.path.join(self.dir, f"{name}.log")
            if os.path.exists(path):
                with open(path) as f:
                    out.append(f"--- {name}:\n{f.read()[-2000:]}")
        return "\n".join(out)

    def finish(self, controller: Controller) -> dict:
        """The final JSON line of ``controller``, once it and every worker have exited 0."""
        final = controller.line()
        assert controller.proc.wait(timeout=WAIT_S) == 0, controller.stderr()
        for role, proc in self.workers.items():
            assert proc.wait(timeout=WAIT_S) == 0, f"{role} worker exited with {proc.returncode}\n{self.logs()}"
        return final

    def check_ledger(self) -> list:
        """The run's events, after ``rlx ledger verify`` and ``rlx audit check`` pass on it."""
        write_run_pointer(self.dir, self.ledger, self.run)  # DIR names the ledger; DIR/params is the store
        for argv in (["ledger", "verify", self.ledger, "--run", self.run], ["audit", self.dir, "check"]):
            done = subprocess.run(rlx_argv(*argv), capture_output=True, text=True, env=environment(), timeout=300)
            assert done.returncode == 0, (argv, done.stdout[-3000:], done.stderr[-3000:])
        events = self.events()
        assert type(events[-1].event) is ev.RunFinished
        return events

    def close(self) -> None:
        for proc in [*(c.proc for c in self.controllers), *self.workers.values()]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()


@pytest.fixture
def deployment(tmp_path, pg_url, cache_dir):
    d = Deployment(tmp_path, pg_url, cache_dir)
    yield d
    d.close()


def trained(step: int, after_seq: int = 0):
    """A predicate: version ``step`` or later was published after ``after_seq``."""
    return lambda events: any(type(s.event) is ev.WeightsPublished and s.event.version >= step and s.seq > after_seq
                              for s in events)


def started(events, epoch: int) -> int:
    """The seq of the ``ControllerStarted`` of ``epoch``."""
    return next(s.seq for s in events if type(s.event) is ev.ControllerStarted and s.event.epoch == epoch)


@pytest.mark.slow
@pytest.mark.postgres
def test_a_killed_controller_is_replaced_on_its_port_and_the_run_ends_as_if_uninterrupted(deployment, reference):
    port = free_port()
    first = deployment.controller(port)
    deployment.start_workers([port])
    deployment.wait_for("step 1", trained(1))
    first.proc.kill()
    assert first.proc.wait(timeout=30) == -signal.SIGKILL
    assert not any(type(s.event) is ev.RunFinished for s in deployment.events())  # killed mid-run

    second = deployment.controller(port)
    assert second.epoch == first.epoch + 1
    final = deployment.finish(second)
    assert final["finished"] and final["final_version"] == STEPS
    assert final["final_digest"] == reference

    events = deployment.check_ledger()
    after = started(events, second.epoch)
    assert any(type(s.event) is ev.WeightsPublished for s in events if s.seq > after)  # work went on under it
    assert all(s.epoch == second.epoch for s in events if s.seq >= after)


@pytest.mark.slow
@pytest.mark.postgres
def test_a_paused_controller_is_fenced_by_its_successor_and_exits_in_one_line(deployment, reference):
    a_port, b_port = free_port(), free_port()
    a = deployment.controller(a_port)
    deployment.start_workers([a_port, b_port])
    deployment.wait_for("step 1", trained(1))
    a.proc.send_signal(signal.SIGSTOP)  # the zombie: alive, holding its port and connections, silent
    try:
        b = deployment.controller(b_port)
        assert b.epoch == a.epoch + 1
        events = deployment.wait_for("a step under the second controller",
                                     lambda es: any(type(s.event) is ev.ControllerStarted and s.event.epoch == b.epoch
                                                    for s in es) and trained(0, started(es, b.epoch))(es))
        # It took over mid-run: the run, if already finished (the steps are fast), finished under it.
        took_over = started(events, b.epoch)
        assert all(s.seq > took_over and s.epoch == b.epoch for s in events if type(s.event) is ev.RunFinished)
    finally:
        a.proc.send_signal(signal.SIGCONT)
    assert a.proc.wait(timeout=60) == 2
    errors = [line for line in a.stderr().splitlines() if line.startswith("rlx: error:")]
    assert len(errors) == 1 and "fenced" in errors[0] and "Traceback" not in a.stderr(), a.stderr()

    final = deployment.finish(b)
    assert final["finished"] and final["final_version"] == STEPS
    assert final["final_digest"] == reference

    events = deployment.check_ledger()
    took_over = started(events, b.epoch)
    assert [s.epoch for s in events if s.seq >= took_over] == [b.epoch] * (events[-1].seq - took_over + 1)
    assert max(s.seq for s in events if s.epoch == a.epoch) < took_over  # nothing of the zombie after it


PUT_IN_FLIGHT = """
import sys
import numpy as np
from runtime.params import ParamStore
ParamStore.open(sys.argv[1], create=True).put(1, {"w": np.arange(4, dtype=np.float32)})
"""


def test_a_replacement_controller_leaves_a_put_in_flight_alone(tmp_path):
    """The workers outlive a replaced controller: the trainer may be writing the next version
    when the new controller starts, and data that no manifest publishes yet is not its to delete.
    (The put is stopped between its arrays and its manifest, by the ``params.put`` failpoint.)"""
    from runtime.config import load_config
    from runtime.controller import ControllerLoop
    from runtime.params import ParamStore

    ledger, params = str(tmp_path / "ledger.db"), str(tmp_path / "params")
    config = load_config(None, ["run.steps=2"], data_size=8)
    with open_store(ledger, create=True) as store:
        ControllerLoop.create(store, run_id="run", config=config.to_dict(), config_digest=config.digest(), seed=1)
    killed = subprocess.run([sys.executable, "-c", PUT_IN_FLIGHT, params], capture_output=True, text=True,
                            env={**environment(), "RLX_FAILPOINTS": "params.put@1", "RLX_TEST_FAILPOINTS": "1"}, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    in_flight = ParamStore.open(params).unpublished()
    assert len(in_flight) == 1

    proc = subprocess.Popen(rlx_argv("controller", "--ledger", ledger, "--params", params, "--listen", "127.0.0.1:0"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment())
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert json.loads(line)["epoch"] == 2, proc.stderr.read() if proc.stderr else line
        assert ParamStore.open(params).unpublished() == in_flight
    finally:
        proc.kill()
        proc.wait()
