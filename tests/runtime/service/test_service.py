"""The controller service over real gRPC on loopback: round trips, long-poll, hostile submissions,
liveness through heartbeats, the token rule off loopback, and the one-line refusals of the CLI.

Each test serves an in-process ``ControllerLoop`` (memory ledger, a clock the test moves) and
talks to it through ``ControllerClient`` or a raw stub, with the simulated workers of
``runtime.controller.simulation`` doing the work.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest

from ledger import events as ev
from ledger import open_store
from ledger.codec import encode_event
from runtime._generated import rlx_controller_pb2 as pb
from runtime._generated import rlx_controller_pb2_grpc as pb_grpc
from runtime.config import load_config
from runtime.controller import ControllerLoop
from runtime.controller.simulation import SimInference, SimTrainer, SimVerifier, run_to_end
from runtime.controller.workers import INFERENCE, TRAINER, VERIFIER, InitTask
from runtime.errors import UsageError
from runtime.host import Front
from runtime.service import wire
from runtime.service.client import ControllerClient
from runtime.service.server import MAX_THREADS, ControllerService, serve
from verifiers.errors import ConfigError
from verifiers.service.security import ListenAddress, ServerSecurity

LEASE_TIMEOUT_S = 5.0
TOKEN = "service-test-token-0123456789"
OVERRIDES = ["run.steps=3", "sampling.group_size=2", "scheduling.groups_per_batch=2"]


class Clock:
    """The controller's clock, moved by the test (lease expiry only; long-poll waits use real time)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def new_loop(store, clock=None, lease_timeout_s: float = LEASE_TIMEOUT_S) -> ControllerLoop:
    config = load_config(None, OVERRIDES, data_size=8)
    return ControllerLoop.create(store, run_id="r", config=config.to_dict(), config_digest=config.digest(), seed=1,
                                 clock=clock or Clock(), lease_timeout_s=lease_timeout_s)


class Served:
    """A loop served on loopback (with ``threads`` handler threads), a client and a raw stub to it."""

    def __init__(self, security: ServerSecurity = ServerSecurity(), host: str = "127.0.0.1", token: str | None = None,
                 *, threads: int = MAX_THREADS, lease_timeout_s: float = LEASE_TIMEOUT_S):
        self.store, self.clock = open_store("memory://"), Clock()
        self.loop = new_loop(self.store, self.clock, lease_timeout_s)
        self.front = Front(self.loop, config={"k": 1}, params_url="memory://params")
        self.service = ControllerService(self.front)
        self.served = serve(self.service, ListenAddress(host, 0), security, threads=threads)
        self.target = f"127.0.0.1:{self.served.port}"
        self.client = ControllerClient([self.target], token=token)
        self.channel = grpc.insecure_channel(self.target)
        self.stub = pb_grpc.ControllerStub(self.channel)

    def head(self) -> int:
        return self.store.head("r").seq

    def close(self):
        self.client.close()
        self.channel.close()
        self.served.stop(0)


@pytest.fixture
def svc():
    s = Served()
    yield s
    s.close()


def submit_raw(s: Served, worker_id: str, events: list[pb.Event]):
    secret = s.client.secrets.get(worker_id, "")
    return s.stub.Submit(pb.SubmitRequest(worker_id=worker_id, secret=secret, events=events), timeout=10)


def publish_v0(client: ControllerClient, trainer_id: str = "t") -> None:
    polled = client.poll(trainer_id, wait_s=0)
    assert isinstance(polled.train, InitTask)
    reply = client.submit(trainer_id, [SimTrainer(trainer_id, seed=1).initialize(InitTask())])
    assert [v.accepted for v in reply.verdicts] == [True]


# -- round trips ------------------------------------------------------------------------------------


def floats(e: ev.Event) -> ev.Event:
    """The wire takes metrics as floats only (the real trainer's); the simulated trainer counts
    its rollouts in an int."""
    if type(e) is ev.TrainStepCompleted:
        return dataclasses.replace(e, metrics={k: float(v) for k, v in e.metrics.items()})
    return e


def drive(client: ControllerClient, infer: list[SimInference], verifier: SimVerifier, trainer: SimTrainer) -> None:
    """``run_to_end``'s schedule, every call over gRPC."""
    for w in infer:
        assert client.join(w.worker_id, INFERENCE, slots=w.slots).standing == pb.JOINED
    assert client.join(verifier.worker_id, VERIFIER).standing == pb.JOINED
    assert client.join(trainer.worker_id, TRAINER).standing == pb.JOINED
    for _ in range(10_000):
        polled = client.poll(trainer.worker_id, wait_s=0)
        if polled.standing == pb.FINISHED:
            return
        if polled.train is not None:
            task = polled.train
            done = ([trainer.initialize(task)] if isinstance(task, InitTask) else
                    [floats(e) for e in trainer.train(task)])
            assert all(v.accepted for v in client.submit(trainer.worker_id, done).verdicts)
        for w in infer:
            leases = list(client.poll(w.worker_id, wait_s=0).leases)
            if leases:
                assert all(v.accepted for v in client.submit(w.worker_id, w.generate(leases)).verdicts)
        tasks = list(client.poll(verifier.worker_id, max_items=1 << 20, wait_s=0).scores)
        if tasks:
            assert all(v.accepted for v in client.submit(verifier.worker_id, verifier.score(tasks)).verdicts)
        assert client.heartbeat(verifier.worker_id) in (pb.JOINED, pb.FINISHED)
    raise AssertionError("the run over gRPC did not finish")


def test_a_run_over_grpc_writes_the_ledger_of_the_same_run_in_process(svc):
    info = svc.client.describe()
    assert (info.standing, info.run_id, info.params_url, info.epoch) == (pb.JOINED, "r", "memory://params", 1)
    assert info.config == {"k": 1} and 0 < info.heartbeat_s <= LEASE_TIMEOUT_S
    drive(svc.client, [SimInference(f"inference-{i}", 4) for i in range(2)], SimVerifier(), SimTrainer(seed=1))
    assert svc.loop.finished and svc.client.describe().standing == pb.FINISHED
    assert svc.client.join("late", INFERENCE).standing == pb.FINISHED
    assert svc.client.heartbeat("late") == pb.FINISHED

    direct = open_store("memory://")
    run_to_end(new_loop(direct))
    over_grpc = [encode_event(s.event) for s in svc.store.read("r")]
    assert over_grpc == [encode_event(floats(s.event)) for s in direct.read("r")]  # nothing lost or changed on the wire


def test_long_poll_returns_when_work_appears_not_at_the_deadline(svc):
    svc.client.join("w", INFERENCE, slots=4)
    svc.client.join("t", TRAINER)
    started = time.monotonic()
    assert not svc.client.poll("w", wait_s=0.3).leases  # nothing to do: answered at the deadline
    assert 0.25 <= time.monotonic() - started < 5

    got: dict = {}

    def poll():
        got["reply"] = svc.client.twin().poll("w", wait_s=20)
        got["at"] = time.monotonic()

    waiter = threading.Thread(target=poll)
    waiter.start()
    time.sleep(0.5)
    published = time.monotonic()
    publish_v0(svc.client)  # version 0 exists: requests are made and leased to w
    waiter.join(timeout=20)
    assert len(got["reply"].leases) == 4
    assert got["at"] - published < 3  # woken by the change, 17 s before its deadline


def test_a_duplicate_submission_is_rejected_with_a_reason_and_not_written(svc):
    svc.client.join("w", INFERENCE, slots=4)
    svc.client.join("t", TRAINER)
    publish_v0(svc.client)
    leases = list(svc.client.poll("w", wait_s=0).leases)
    done = SimInference("w", 4).generate(leases)
    assert all(v.accepted for v in svc.client.submit("w", done).verdicts)
    head, rejected = svc.head(), svc.loop.rejected
    again = svc.client.submit("w", done[:2]).verdicts
    assert [v.accepted for v in again] == [False, False] and all("duplicate" in v.reason for v in again)
    assert svc.head() == head and svc.loop.rejected == rejected + 2


# -- hostile submissions ------------------------------------------------------------------------------


def test_malformed_and_foreign_submissions_are_invalid_argument_and_nothing_is_written(svc):
    svc.client.join("a", INFERENCE, slots=4)
    svc.client.join("b", INFERENCE, slots=4)
    svc.client.join("v", VERIFIER)
    svc.client.join("t", TRAINER)
    publish_v0(svc.client)
    lease = svc.client.poll("a", wait_s=0).leases[0]
    good = SimInference("a").generate([lease])[0]
    ok_outcome = ev.OutcomeRecorded(lease.rollout_id, 1.0, True, "AC", "sim", "1")
    kind, version, body = encode_event(good)

    def replace(**fields):
        return ev.RolloutCompleted(**{**{f: getattr(good, f) for f in good.__dataclass_fields__}, **fields})

    cases = {
        "in another worker's name": ("a", [replace(worker_id="b")], "in the name of 'b'"),
        "a kind its role may not submit": ("a", [ok_outcome], "may not submit OutcomeRecorded"),
        "decisions are not submissions": ("t", [ev.RunFinished(1, "x", "completed")], "may not submit RunFinished"),
        "tokens as a float array": ("a", [replace(tokens=good.tokens.astype(np.float32))], "1-D int32"),
        "log-probs of another length": ("a", [replace(logprobs=good.logprobs[:-1] if len(good.logprobs) > 1
                                                      else np.zeros(2, np.float32))], "as long as its tokens"),
        "an unknown finish reason": ("a", [replace(finish_reason="x" * 1000)], "finish_reason"),
        "a NaN reward": ("v", [ev.OutcomeRecorded(lease.rollout_id, float("nan"), True, "AC", "sim", "1")],
                         "finite float"),
        "an integer reward": ("v", [ev.OutcomeRecorded(lease.rollout_id, 1, True, "AC", "sim", "1")], "finite float"),
    }
    head = svc.head()
    for name, (worker, events, message) in cases.items():
        with pytest.raises(grpc.RpcError) as info:
            submit_raw(svc, worker, [wire.event_to_proto(e) for e in events])
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        assert message in info.value.details(), (name, info.value.details())
        assert svc.head() == head, name
    raw = {
        "undecodable msgpack": ("a", [pb.Event(kind=kind, version=version, body=b"\xc1\x00garbage")]),
        "a truncated body": ("a", [pb.Event(kind=kind, version=version, body=body[:-3])]),
        "an unknown kind": ("a", [pb.Event(kind="Nope", version=1, body=body)]),
        "an unknown schema version": ("a", [pb.Event(kind=kind, version=99, body=body)]),
        "a good event after a bad one": ("a", [pb.Event(kind=kind, version=version, body=b"\xc1"),
                                               wire.event_to_proto(good)]),
        "a bad worker id": ("a b", [wire.event_to_proto(good)]),
    }
    for name, (worker, messages) in raw.items():
        with pytest.raises(grpc.RpcError) as info:
            submit_raw(svc, worker, messages)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        assert svc.head() == head, name
    with pytest.raises(UsageError, match="INVALID_ARGUMENT"):  # the client: retrying cannot help
        svc.client.submit("a", [replace(worker_id="b")])
    assert svc.head() == head
    # The same completion, well formed, is still accepted once: nothing above counted.
    assert [v.accepted for v in svc.client.submit("a", [good]).verdicts] == [True]


def test_bad_join_requests_are_invalid_argument(svc):
    for request in (pb.JoinRequest(worker_id="w", role="boss", slots=1),
                    pb.JoinRequest(worker_id="w", role=INFERENCE, slots=0),
                    pb.JoinRequest(worker_id="", role=INFERENCE, slots=1),
                    pb.JoinRequest(worker_id="w", role=INFERENCE, slots=1, info=b"\xc1")):
        with pytest.raises(grpc.RpcError) as info:
            svc.stub.Join(request, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not svc.loop.state.workers


# -- liveness ------------------------------------------------------------------------------------------


def test_heartbeats_keep_named_leases_a_silent_worker_is_lost_and_joins_again_under_a_new_id(svc):
    c = svc.client
    for w in ("a", "b", "c"):
        c.join(w, INFERENCE, slots=2)
    c.join("t", TRAINER)
    publish_v0(c)
    leases = {w: list(c.poll(w, wait_s=0).leases) for w in ("a", "b", "c")}
    held = {w: [lease.rollout_id for lease in got] for w, got in leases.items()}
    assert all(len(ids) == 2 for ids in held.values()), held
    svc.clock.now = 4.0
    assert c.heartbeat("a", rollouts=held["a"]) == pb.JOINED  # "still generating these"
    assert c.heartbeat("c") == pb.JOINED  # alive, but names nothing
    c.heartbeat("t")
    svc.clock.now = 8.0  # 8 s since b's last call, 4 s since a's and c's heartbeats
    svc.loop.expire()
    events = [s.event for s in svc.store.read("r")]
    abandoned = {e.rollout_id for e in events if type(e) is ev.RolloutAbandoned}
    lost = [e for e in events if type(e) is ev.WorkerLost]
    assert lost == [ev.WorkerLost("b", "heartbeat timeout")]
    assert abandoned == set(held["c"])  # c's leases were older than the timeout; a renewed its own
    assert {m.rollout_id for m in c.poll("a", wait_s=0).leases} == set(held["a"])

    assert c.poll("b", wait_s=0).standing == pb.NOT_JOINED
    assert c.heartbeat("b") == pb.NOT_JOINED
    # b's late completions are judged by the fold: their requests are still open, so they count, once.
    late = c.submit("b", SimInference("b").generate(leases["b"]))
    assert late.standing == pb.NOT_JOINED and [v.accepted for v in late.verdicts] == [True, True]
    assert not any(v.accepted for v in c.submit("b", SimInference("b").generate(leases["b"])).verdicts)
    assert c.join("b~1", INFERENCE, slots=2).standing == pb.JOINED
    assert c.poll("b~1", wait_s=0).standing == pb.JOINED and svc.loop.joined("b~1")


def test_leave_gives_the_leases_back_at_once(svc):
    c = svc.client
    c.join("a", INFERENCE, slots=2)
    c.join("t", TRAINER)
    publish_v0(c)
    assert c.poll("a", wait_s=0).leases
    c.leave("a", "shutdown")
    assert not svc.loop.joined("a") and ev.WorkerLost("a", "shutdown") in [s.event for s in svc.store.read("r")]
    assert c.poll("a", wait_s=0).standing == pb.NOT_JOINED


# -- security ----------------------------------------------------------------------------------------


def test_a_listener_off_loopback_needs_a_token():
    store = open_store("memory://")
    service = ControllerService(Front(new_loop(store), config={}, params_url="memory://p"))
    with pytest.raises(ConfigError, match="needs a token"):
        serve(service, ListenAddress("0.0.0.0", 0), ServerSecurity())


def test_calls_without_the_right_token_are_unauthenticated():
    s = Served(ServerSecurity(token=TOKEN), host="0.0.0.0", token=TOKEN)
    try:
        for metadata in ((), (("authorization", "Bearer wrong-token-0123456789"),), (("authorization", TOKEN),)):
            for call, request in ((s.stub.Describe, pb.DescribeRequest()),
                                  (s.stub.Join, pb.JoinRequest(worker_id="x", role=INFERENCE, slots=1))):
                with pytest.raises(grpc.RpcError) as info:
                    call(request, timeout=10, metadata=metadata)
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(UsageError, match="UNAUTHENTICATED"):
            ControllerClient([s.target], token="wrong-token-0123456789").describe()
        assert not s.loop.state.workers  # nothing refused reached the controller
        assert s.client.describe().run_id == "r"
        assert s.client.join("x", INFERENCE).standing == pb.JOINED
    finally:
        s.close()


# -- the command line ----------------------------------------------------------------------------------


def rlx(*argv: str) -> subprocess.CompletedProcess:
    """``rlx ARGV`` in a process of its own, without a token in its environment."""
    env = {k: v for k, v in os.environ.items() if k != "RLX_TOKEN"}
    return subprocess.run([sys.executable, "-m", "runtime.cli", *argv], capture_output=True, text=True, env=env,
                          timeout=120)


def one_line_error(done: subprocess.CompletedProcess) -> str:
    err = done.stderr
    assert err.count("\n") == 1 and err.startswith("rlx: error:") and "Traceback" not in err, err
    return err


@pytest.mark.slow
def test_a_worker_without_a_controller_gives_up_in_one_line():
    started = time.monotonic()
    done = rlx("worker", "inference", "--controller", "127.0.0.1:1", "--retry-for", "1")
    assert done.returncode == 2 and time.monotonic() - started < 60
    assert "no controller answered" in one_line_error(done)


def test_a_controller_off_loopback_without_a_token_refuses_to_start(tmp_path):
    ledger = tmp_path / "ledger.db"
    done = rlx("controller", "--ledger", str(ledger), "--params", str(tmp_path / "params"),
               "--listen", "0.0.0.0:0", "--steps", "1")
    assert done.returncode == 2 and "needs a token" in one_line_error(done)
    assert not ledger.exists() and not (tmp_path / "params").exists()


@pytest.mark.slow
def test_a_call_to_a_paused_controller_fails_over_in_seconds_not_at_its_deadline(tmp_path):
    """A controller process that is stopped (or cut off) keeps its socket open: only keepalive
    pings tell the worker, within about two ping periods, instead of the call's deadline."""
    from runtime.service.client import Disconnected
    from runtime.service.server import KEEPALIVE_S

    env = {k: v for k, v in os.environ.items() if k != "RLX_TOKEN"}
    proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "controller", "--ledger", str(tmp_path / "l.db"),
                             "--params", str(tmp_path / "params"), "--listen", "127.0.0.1:0", "--steps", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    client = None
    try:
        assert proc.stdout is not None
        line = json.loads(proc.stdout.readline())
        with open(line["token_file"]) as f:  # a controller given no token made one
            client = ControllerClient([line["listening"]], token=f.read().strip())
        assert client.join("w", INFERENCE).standing == pb.JOINED
        proc.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(Disconnected, match="UNAVAILABLE"):
            client.poll("w", wait_s=wire.MAX_WAIT_S)  # its deadline is 60 s away
        assert time.monotonic() - started < 4 * KEEPALIVE_S
    finally:
        if client is not None:
            client.close()
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()
