"""A worker id is not a credential, and a request costs what its method allows, over real gRPC.

With the run's token alone a client could poll another worker's leases, submit in its name, make it
leave, join a second trainer, hold every handler thread with long polls, grow the ledger with a
flood of joins, make the server buffer a 200 MiB ``Submit`` before refusing its token, and turn a
deeply nested ``Join.info`` into ``UNKNOWN`` (which workers retry). Each test serves an in-process
controller on loopback (memory ledger) and attacks it as a token holder would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import grpc
import pytest

from ledger import events as ev
from ledger import open_store
from runtime._generated import rlx_controller_pb2 as pb
from runtime._generated import rlx_controller_pb2_grpc as pb_grpc
from runtime.controller import ControllerLoop
from runtime.controller.simulation import SimInference, SimTrainer
from runtime.controller.workers import INFERENCE, TRAINER, InitTask
from runtime.errors import UsageError
from runtime.host import Busy, Front, Refused, Standing, ThreadPort, WrongSecret
from runtime.host.front import JOIN_BURST, JOINS_PER_S, MAX_INFO_DEPTH, POLLS_PER_WORKER
from runtime.service.client import ControllerClient
from runtime.service.server import RECEIVE_BYTES
from tests.runtime.service.test_service import Served as ServedLoop
from tests.runtime.service.test_service import new_loop
from verifiers.service.security import ListenAddress, ServerSecurity

OVERRIDES = ["run.steps=3", "sampling.group_size=2", "scheduling.groups_per_batch=2"]


class Served(ServedLoop):
    """A controller on loopback, an honest client of it and an attacker's (no secrets)."""

    def __init__(self, threads: int = 256):
        super().__init__(threads=threads, lease_timeout_s=60.0)
        self.attacker = ControllerClient([self.target])

    def events(self) -> list[ev.Event]:
        return [s.event for s in self.store.read("r")]

    def close(self) -> None:
        self.attacker.close()
        super().close()


@pytest.fixture
def svc():
    s = Served()
    yield s
    s.close()


def started(s: Served) -> SimInference:
    """Worker ``a`` (inference) and trainer ``t`` joined by the honest client, version 0 published."""
    s.client.join("a", INFERENCE, slots=2)
    s.client.join("t", TRAINER)
    assert isinstance(s.client.poll("t", wait_s=0).train, InitTask)
    assert [v.accepted for v in s.client.submit("t", [SimTrainer("t", seed=1).initialize(InitTask())]).verdicts] == [True]
    return SimInference("a", 2)


def test_no_call_under_another_workers_id_gets_through_without_its_secret(svc):
    worker = started(svc)
    secret = svc.client.secrets["a"]
    assert len(secret) >= 32 and secret not in repr(svc.events())  # the secret is nowhere in the ledger
    leases = list(svc.client.poll("a", wait_s=0).leases)
    done = worker.generate(leases)
    head = svc.store.head("r").seq
    calls = {
        "poll": lambda: svc.attacker.poll("a", wait_s=0),
        "submit": lambda: svc.attacker.submit("a", done),
        "heartbeat": lambda: svc.attacker.heartbeat("a"),
        "leave": lambda: svc.attacker.leave("a", "I say so"),
    }
    for name, call in calls.items():
        with pytest.raises(UsageError) as info:  # not retried: Disconnected would be
            call()
        assert "PERMISSION_DENIED: worker 'a' joined under another secret" in str(info.value), name
    for wrong in ("", "x" * 32, secret[:-1], secret + "x", "é" * 40):
        for call, request in ((svc.stub.Poll, pb.PollRequest(worker_id="a", secret=wrong, wait_s=0)),
                              (svc.stub.Heartbeat, pb.HeartbeatRequest(worker_id="a", secret=wrong)),
                              (svc.stub.Leave, pb.LeaveRequest(worker_id="a", secret=wrong, reason="x"))):
            with pytest.raises(grpc.RpcError) as raw:
                call(request, timeout=10)
            assert raw.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert svc.store.head("r").seq == head and svc.loop.joined("a")  # nothing was written; a is still joined
    # The honest worker is untouched: its leases, its submission, its leave.
    assert [lease.rollout_id for lease in svc.client.poll("a", wait_s=0).leases] == [x.rollout_id for x in leases]
    assert all(v.accepted for v in svc.client.submit("a", done).verdicts)
    svc.client.leave("a", "shutdown")
    assert ev.WorkerLost("a", "shutdown") in svc.events()


def test_an_id_this_controller_never_admitted_stands_not_joined_and_nothing_of_it_is_recorded(svc):
    worker = started(svc)
    leases = list(svc.client.poll("a", wait_s=0).leases)
    head = svc.store.head("r").seq
    assert svc.attacker.poll("ghost", wait_s=0).standing == Standing.NOT_JOINED
    assert svc.attacker.heartbeat("ghost") == Standing.NOT_JOINED
    forged = [e.__class__(**{**e.__dict__, "worker_id": "ghost"}) for e in worker.generate(leases)]
    reply = svc.attacker.submit("ghost", forged)
    assert reply.standing == Standing.NOT_JOINED
    assert [(v.accepted, v.reason) for v in reply.verdicts] == [
        (False, "worker 'ghost' has not joined this controller; join again")] * len(forged)
    svc.attacker.leave("ghost", "x")
    assert svc.store.head("r").seq == head


def test_after_a_controller_restart_old_secrets_stand_not_joined_and_the_worker_joins_again(svc):
    started(svc)
    old = ThreadPort(svc.front)
    old.join("w", INFERENCE)
    loop = ControllerLoop.resume(svc.store, "r", lease_timeout_s=60.0)  # the same ledger, a new controller
    front = Front(loop, config={}, params_url="memory://params")
    assert front.poll("w", old.secrets["w"], wait_s=0).standing == Standing.NOT_JOINED
    assert front.heartbeat("w", old.secrets["w"]) == Standing.NOT_JOINED
    port = ThreadPort(front)
    assert port.join("w~1", INFERENCE).standing == Standing.JOINED
    assert port.poll("w~1", wait_s=0).standing == Standing.JOINED


def test_the_thread_runners_port_carries_its_secrets_and_another_port_cannot_borrow_them(svc):
    mine, other = ThreadPort(svc.front), ThreadPort(svc.front)
    mine.join("x", INFERENCE)
    assert mine.poll("x", wait_s=0).standing == Standing.JOINED
    with pytest.raises(WrongSecret, match="worker 'x' joined under another secret"):
        other.poll("x", wait_s=0)
    with pytest.raises(WrongSecret):
        svc.front.heartbeat("x", "")


def test_a_second_trainer_is_refused_while_one_is_joined(svc):
    svc.client.join("t", TRAINER)
    with pytest.raises(Busy, match="trainer 't' is joined and a run has one trainer"):
        svc.attacker.join("t2", TRAINER)
    with pytest.raises(Busy, match="trainer 't' is joined"):
        ThreadPort(svc.front).join("t3", TRAINER)
    assert [e.worker_id for e in svc.events() if type(e) is ev.WorkerJoined] == ["t"]
    svc.client.leave("t", "shutdown")
    assert svc.attacker.join("t2", TRAINER).standing == Standing.JOINED  # once it has left, another may join


def test_a_flood_of_joins_and_leaves_is_refused_past_the_burst(svc):
    accepted, refusals = 0, set()
    begun = time.monotonic()
    for i in range(JOIN_BURST + 64):
        try:
            svc.attacker.join(f"flood-{i}", INFERENCE, info={"pad": "x" * 1000})
        except Busy as e:
            refusals.add(str(e).split(": ", 1)[1])
            continue
        accepted += 1
        svc.attacker.leave(f"flood-{i}", "again")
    elapsed = time.monotonic() - begun
    assert accepted <= JOIN_BURST + JOINS_PER_S * elapsed + 1, (accepted, elapsed)
    assert refusals == {f"more joins than {JOINS_PER_S:g} a second after a burst of {JOIN_BURST}; join again later"}
    assert sum(type(e) is ev.WorkerJoined for e in svc.events()) == accepted


def test_a_worker_has_at_most_its_share_of_polls_waiting(svc):
    svc.client.join("w", INFERENCE)  # no version 0: a poll waits for its whole wait
    twins = [svc.client.twin() for _ in range(POLLS_PER_WORKER)]
    waiting = [threading.Thread(target=c.poll, args=("w",), kwargs={"wait_s": 2.0}, daemon=True) for c in twins]
    for t in waiting:
        t.start()
    deadline = time.monotonic() + 10
    while svc.front._polling.get("w", 0) < POLLS_PER_WORKER and time.monotonic() < deadline:
        time.sleep(0.02)
    with pytest.raises(Busy, match=f"worker 'w' has {POLLS_PER_WORKER} polls waiting already"):
        svc.client.poll("w", wait_s=3.0)
    for t in waiting:
        t.join()
    assert svc.client.poll("w", wait_s=0).standing == Standing.JOINED  # answered: the share is free again


def test_long_polls_leave_threads_for_a_heartbeat():
    threads, polls = 8, 6  # serve() lets polls hold three quarters of the threads
    s = Served(threads=threads)
    try:
        clients = [ControllerClient([s.target]) for _ in range(threads)]
        for i, c in enumerate(clients):
            c.join(f"p{i}", INFERENCE)  # no version 0: each poll waits for its whole wait
        s.client.join("honest", INFERENCE)
        answers: list[str] = []

        def poll(i: int) -> None:
            try:
                clients[i].poll(f"p{i}", wait_s=5.0)
                answers.append("answered")
            except Busy:
                answers.append("busy")

        waiting = [threading.Thread(target=poll, args=(i,), daemon=True) for i in range(threads)]
        for t in waiting:
            t.start()
        deadline = time.monotonic() + 10
        while (sum(s.front._polling.values()) < polls or len(answers) < threads - polls) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert answers == ["busy"] * (threads - polls)  # refused at once, not queued behind the others
        # Every poll that got in is still waiting, and the heartbeat still finds a thread.
        beat = s.stub.Heartbeat(pb.HeartbeatRequest(worker_id="honest", secret=s.client.secrets["honest"]), timeout=3)
        assert beat.standing == pb.JOINED and sum(s.front._polling.values()) == polls
        for t in waiting:
            t.join()
        for c in clients:
            c.close()
    finally:
        s.close()


# -- what a request may cost -----------------------------------------------------------------------------------------

TOKEN = "credentials-test-token-0123456789"
SERVER = f"""
import sys
from ledger import open_store
from runtime.config import load_config
from runtime.controller import ControllerLoop
from runtime.host import Front
from runtime.service.server import ControllerService, serve
from tests.runtime.service.test_service import Served as ServedLoop
from tests.runtime.service.test_service import new_loop
from verifiers.service.security import ListenAddress, ServerSecurity

config = load_config(None, {OVERRIDES!r}, data_size=8)
loop = ControllerLoop.create(open_store("memory://"), run_id="r", config=config.to_dict(),
                             config_digest=config.digest(), seed=1)
s = serve(ControllerService(Front(loop, config={{}}, params_url="memory://p")), ListenAddress("127.0.0.1", 0),
          ServerSecurity(token={TOKEN!r}))
print(s.port, flush=True)
sys.stdin.read()
"""


def peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the server's peak RSS from /proc")
def test_an_unauthenticated_200_mib_submit_is_refused_without_being_buffered():
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        before = peak_rss_kib(server.pid)
        big = pb.SubmitRequest(worker_id="x", events=[pb.Event(kind="RolloutCompleted", version=1,
                                                                 body=b"\0" * (200 << 20))])
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 1 << 30)]) as ch:
            with pytest.raises(grpc.RpcError) as info:
                pb_grpc.ControllerStub(ch).Submit(big, timeout=60)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        grown_mib = (peak_rss_kib(server.pid) - before) / 1024
        assert grown_mib < 32, grown_mib  # before the fix: about 700 MiB (the body received, then parsed)
    finally:
        server.stdin.close()
        server.wait(timeout=30)


def test_each_method_refuses_a_request_over_its_own_limit_before_parsing_it(svc):
    big_info = b"\x81\xa3pad\xdb" + (70_000).to_bytes(4, "big") + b"x" * 70_000  # {"pad": 70 kB}: over Join's limit
    with pytest.raises(grpc.RpcError) as info:
        svc.stub.Join(pb.JoinRequest(worker_id="w", role=INFERENCE, slots=1, info=big_info), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("a Join request of ")
    assert info.value.details().endswith(f"bytes; at most {RECEIVE_BYTES['Join']} are accepted")
    with pytest.raises(grpc.RpcError) as info:
        svc.stub.Leave(pb.LeaveRequest(worker_id="w", reason="x" * (RECEIVE_BYTES["Leave"] + 1)), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "a Leave request of" in info.value.details()
    garbage = svc.channel.unary_unary("/rlx.controller.v1.Controller/Poll")  # raw bytes, not a PollRequest
    with pytest.raises(grpc.RpcError) as info:
        garbage(b"\xff\xff\xff", timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not a PollRequest" in info.value.details()
    assert not svc.loop.state.workers


def nested_map(depth: int) -> bytes:
    """The msgpack of ``{"a": {"a": ... None}}``, ``depth`` maps deep."""
    return b"\x81\xa1a" * depth + b"\xc0"


@pytest.mark.parametrize("depth", [MAX_INFO_DEPTH + 1, 1000, 1100, 5000])
def test_a_deeply_nested_info_is_invalid_argument_in_one_line(svc, depth):
    with pytest.raises(grpc.RpcError) as info:
        svc.stub.Join(pb.JoinRequest(worker_id="w", role=INFERENCE, slots=1, info=nested_map(depth)), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # before the fix: UNKNOWN from a RecursionError
    assert "\n" not in info.value.details() and "info" in info.value.details()
    assert not svc.loop.state.workers


def test_a_threads_info_is_bounded_like_a_processes():
    front = Front(new_loop(open_store("memory://"), lease_timeout_s=60.0), config={}, params_url="memory://p")
    info: dict = {}
    for _ in range(2000):
        info = {"a": info}
    with pytest.raises(Refused, match=f"a worker's info nests deeper than {MAX_INFO_DEPTH} levels"):
        front.join("w", INFERENCE, info=info)
    # 20,008 bytes: a 1-byte map header, "pad" in 4, the string's 3-byte header and its 20,000 characters
    with pytest.raises(Refused, match="a worker's info is 20008 bytes; at most 16384 are accepted"):
        front.join("w", INFERENCE, info={"pad": "x" * 20_000})
    assert front.join("w", INFERENCE, info={"engine": [8, 64]}).standing == Standing.JOINED


def test_a_token_sent_in_clear_off_loopback_is_warned_of_in_one_line():
    security = ServerSecurity(token=TOKEN)
    line = security.cleartext(ListenAddress("0.0.0.0", 7000))
    assert line == ("warning: listening on 0.0.0.0 (not loopback) without TLS: the token travels in clear, readable "
                    "by anyone on the network path; give --tls-cert and --tls-key")
    assert security.cleartext(ListenAddress("127.0.0.1", 7000)) is None
    assert ServerSecurity().cleartext(ListenAddress("127.0.0.1", 7000)) is None
