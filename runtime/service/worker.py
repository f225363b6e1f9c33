"""``rlx worker ROLE``: one stateless worker process of a run, served by a controller over gRPC.

The worker asks the controller which run it serves (its logged config and parameter store),
builds what its role needs from that config alone — an engine (inference), the task's verifier
(verifier), the model and train step (trainer) — joins, and then loops: long-poll for work, do
it, submit the results. A thread heartbeats while it works, naming the leases, rollouts or step
in hand, so work longer than the lease timeout is neither taken away nor done twice. Weights are
read by version and checked against the digest the ledger names; nothing else is kept between
calls but caches.

When the controller cannot be reached the worker backs off and retries (the next address first,
if several were given), keeping results it has not delivered; when the controller it reaches does
not know it (declared lost, or a new controller took over) it joins again under a new id.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections.abc import Callable

from ledger import events as ev
from runtime._generated import rlx_controller_pb2 as pb
from runtime.config import Config
from runtime.controller.workers import INFERENCE, TRAINER, VERIFIER
from runtime.errors import RlxError
from runtime.service import wire
from runtime.service.client import AlreadyJoined, ControllerClient, Disconnected

Log = Callable[[str], None]
POLL_WAIT_S = 5.0
BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 5.0


class ControllerGone(RlxError):
    """No controller answered for longer than the worker is willing to wait."""


class _Backoff:
    """Doubling waits from ``BACKOFF_FIRST_S`` to ``BACKOFF_MAX_S``; gives up after ``limit_s``."""

    def __init__(self, limit_s: float):
        self.limit_s = limit_s
        self.reset()

    def reset(self) -> None:
        self.wait = BACKOFF_FIRST_S
        self.since: float | None = None

    def sleep(self, why: str) -> None:
        now = time.monotonic()
        if self.since is None:
            self.since = now
        elif now - self.since > self.limit_s:
            raise ControllerGone(f"no controller answered for {now - self.since:.0f} s (last: {why})")
        time.sleep(self.wait)
        self.wait = min(self.wait * 2, BACKOFF_MAX_S)


class Working:
    """What the worker has in hand, for its heartbeats."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rollouts: tuple[int, ...] = ()
        self.steps: tuple[int, ...] = ()

    def set(self, rollouts=(), steps=()) -> None:
        with self.lock:
            self.rollouts, self.steps = tuple(rollouts), tuple(steps)

    def get(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        with self.lock:
            return self.rollouts, self.steps


class _Heartbeat(threading.Thread):
    """Heartbeats every ``period_s`` with what is in hand; notes when the controller has lost
    the worker or the run has finished."""

    def __init__(self, client: ControllerClient, worker_id: str, working: Working, period_s: float):
        super().__init__(name="heartbeat", daemon=True)
        self.client, self.worker_id, self.working, self.period_s = client, worker_id, working, period_s
        self.stop = threading.Event()
        self.standing = pb.JOINED

    def run(self) -> None:
        while not self.stop.wait(self.period_s):
            rollouts, steps = self.working.get()
            try:
                self.standing = self.client.heartbeat(self.worker_id, rollouts=rollouts, steps=steps).standing
            except Disconnected:
                self.client.fail_over()
            except RlxError:
                return


class Role:
    """What one role does with its work: built once from the run's config."""

    role: str
    slots = 1
    info: dict = {}
    max_items = 512

    def rename(self, worker_id: str) -> None:
        """The worker joined (again) under ``worker_id``."""

    def work(self, reply: pb.PollReply, working: Working) -> list[ev.Event]:
        raise NotImplementedError


class InferenceRole(Role):
    role = INFERENCE

    def __init__(self, config: Config, params_url: str, log: Log):
        from runtime.params import ParamStore
        from runtime.session import build_session, fingerprint
        from runtime.workers import EngineWorker, last_version_loader

        session = build_session(config, log=log, judge=False, warm=False)
        load = last_version_loader(ParamStore.open(params_url))
        self.worker = EngineWorker("", session.engine, session.task, session.codec, load,
                                   slots=config.workers.inference_slots)
        self.slots = self.worker.slots
        # The engine's batch shape decides the bits of every completion (replays rebuild it), and
        # the machine's stack those bits come from: both are recorded in WorkerJoined.
        self.info = {"engine": session.engine.batch_shape, "fingerprint": fingerprint()}

    def rename(self, worker_id: str) -> None:
        self.worker.worker_id = worker_id

    def work(self, reply, working):
        leases = [wire.lease_from_proto(m) for m in reply.leases]
        if not leases:
            return []
        working.set(rollouts=[lease.rollout_id for lease in leases])
        return list(self.worker.generate(leases))


class VerifierRole(Role):
    role = VERIFIER

    def __init__(self, config: Config, params_url: str, log: Log):
        from runtime.session import build_scoring
        from runtime.workers import TaskVerifier

        task, codec = build_scoring(config, log=log)  # no model, no engine: nothing to compile
        self.verifier = TaskVerifier("", task, codec)

    def work(self, reply, working):
        tasks = [wire.score_from_proto(m) for m in reply.scores]
        if not tasks:
            return []
        working.set(rollouts=[t.rollout_id for t in tasks])
        return list(self.verifier.score(tasks))


class TrainerRole(Role):
    role = TRAINER

    def __init__(self, config: Config, params_url: str, log: Log, gang=None):
        from runtime.params import ParamStore
        from runtime.session import build_session, fingerprint, make_trainer

        session = build_session(config, log=log, judge=False)
        self.gang = gang
        self.info = {"fingerprint": fingerprint()}  # the stack this trainer's bits come from
        self.trainer = make_trainer(session, ParamStore.open(params_url), "", gang=gang)

    def work(self, reply, working):
        if not reply.HasField("train"):
            return []
        if self.gang is not None:  # the other ranks run the same step
            self.gang.hand_out(reply.train.SerializeToString())
        return self.run(reply.train, working)

    def run(self, message: pb.TrainTask, working: Working | None = None) -> list[ev.Event]:
        from runtime.controller.workers import InitTask

        task = wire.train_from_proto(message)
        if working is not None:
            working.set(steps=[0 if task is None else task.step])
        if task is None:
            return [self.trainer.initialize(InitTask())]
        return list(self.trainer.train(task))

    def follow(self, log: Log) -> int:
        """A rank other than 0: run the steps rank 0 hands out until it says the run finished."""
        assert self.gang is not None
        while (payload := self.gang.take()) is not None:
            message = pb.TrainTask()
            message.ParseFromString(payload)
            self.run(message)
        log(f"rank {self.gang.rank}: the run has finished")
        return 0


ROLE_TYPES: dict[str, type] = {INFERENCE: InferenceRole, VERIFIER: VerifierRole, TRAINER: TrainerRole}


def run_worker(role: str, client: ControllerClient, *, worker_id: str, log: Log = print,
               retry_for_s: float = 600.0, gang=None) -> int:
    """Serve the run of the controller ``client`` reaches until it finishes; returns 0 then.

    ``gang`` (``runtime.trainer.gang.Gang``, trainers only): rank 0 serves as the gang's one
    trainer worker and hands each task to the other ranks, which only follow it.
    """
    backoff = _Backoff(retry_for_s)
    while True:
        try:
            info = client.describe()
            break
        except Disconnected as e:
            client.fail_over()
            backoff.sleep(str(e))
    backoff.reset()
    if info.standing == pb.FINISHED:
        log(f"run {info.run_id!r} has finished; nothing to do")
        return 0
    config = Config.from_dict(wire.unpack_map(info.config, "run config"))
    work = ROLE_TYPES[role](config, info.params_url, log, **({} if gang is None else {"gang": gang}))
    gc.freeze()  # the model, engine and compiled programs live as long as the process
    if gang is not None and not gang.leader:
        return work.follow(log)
    code = _join_and_serve(work, client, info, worker_id=worker_id, log=log, backoff=backoff)
    if gang is not None:
        gang.stop()
    return code


def _join_and_serve(work: Role, client: ControllerClient, info, *, worker_id: str, log: Log,
                    backoff: _Backoff) -> int:
    beat_client = ControllerClient(client.targets, **client.settings)
    pending: list[tuple[str, list[ev.Event]]] = []  # results not yet delivered, by the id that made them
    attempt = 0
    while True:
        wid = worker_id if attempt == 0 else f"{worker_id}~{attempt}"
        attempt += 1
        try:
            joined = client.join(wid, work.role, slots=work.slots, info=work.info)
        except AlreadyJoined:
            continue
        except Disconnected as e:
            client.fail_over()
            backoff.sleep(str(e))
            continue
        backoff.reset()
        if joined.standing == pb.FINISHED:
            return 0
        work.rename(wid)
        log(f"{wid} joined run {info.run_id!r} (controller epoch {joined.epoch})")
        if _serve(work, client, beat_client, wid, info.heartbeat_s, pending, backoff):
            return 0


def _serve(work: Role, client: ControllerClient, beat_client: ControllerClient, wid: str, heartbeat_s: float,
           pending: list[tuple[str, list[ev.Event]]], backoff: _Backoff) -> bool:
    """Work as ``wid`` until the run finishes (True) or the worker must join again (False)."""
    working = Working()
    beat = _Heartbeat(beat_client, wid, working, heartbeat_s)
    beat.start()
    try:
        while True:
            if pending:
                maker, events = pending[0]
                try:
                    reply = client.submit(maker, events)
                except Disconnected as e:
                    client.fail_over()
                    backoff.sleep(str(e))
                    continue
                del pending[0]
                if reply.standing == pb.FINISHED:
                    return True
                continue
            try:
                polled = client.poll(wid, max_items=work.max_items, wait_s=POLL_WAIT_S)
            except Disconnected as e:
                client.fail_over()
                backoff.sleep(str(e))
                continue
            backoff.reset()
            if polled.standing == pb.FINISHED:
                return True
            if polled.standing == pb.NOT_JOINED or beat.standing == pb.NOT_JOINED:
                return False
            done = work.work(polled, working)
            if done:
                pending.append((wid, done))
            working.set()
    finally:
        beat.stop.set()


def exit_with_parent(period_s: float = 0.5) -> None:
    """Exit (status 1) as soon as the parent process is gone: a worker of a killed ``rlx run``
    does not outlive it."""
    import os

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(period_s)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(role: str, targets: list[str], *, worker_id: str | None, token: str | None, tls: dict,
         retry_for_s: float, gang_spec=None) -> int:
    """One worker process; with ``gang_spec`` (``runtime.trainer.gang.GangSpec``), one rank of a
    trainer gang, joined before anything else touches JAX."""
    import os
    import socket

    gang = None
    if gang_spec is not None:
        from runtime.trainer.gang import Gang

        gang = Gang.join(gang_spec)
    client = ControllerClient(targets, token=token, **tls)
    wid = worker_id or f"{role}-{socket.gethostname()}-{os.getpid()}"

    def log(message: str) -> None:
        print(f"rlx worker {role}: {message}", file=sys.stderr, flush=True)

    try:
        code = run_worker(role, client, worker_id=wid, log=log, retry_for_s=retry_for_s, gang=gang)
    finally:
        client.close()
    if gang is not None:
        gang.shutdown()  # waits for every rank: rank 0 serves the coordinator until the others are done
    return code
