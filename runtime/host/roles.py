"""What each role does with its work, built once: from the host's session (a thread of
``rlx run``) or from the run's logged config alone (a worker process).

An inference role generates its leases with an engine, a verifier role scores completions with
the task's verifier, the trainer role publishes version 0 and trains each step. Each also says
what its ``WorkerJoined`` records: the machine's fingerprint (the stack its bits come from), its
devices (``runtime.placement.joined_info``) and, for inference, the engine's batch shape (which
decides the bits of every completion; replays rebuild it). Both runners record the same.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ledger import events as ev
from runtime.config import Config
from runtime.controller.workers import INFERENCE, TRAINER, VERIFIER, InitTask, TrainTask
from runtime.host.port import Work

Log = Callable[[str], None]


class Working:
    """What a worker has in hand, for its heartbeats."""

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


class Role:
    """What one role does with its work."""

    role: str
    slots = 1
    max_items = 512

    def __init__(self) -> None:
        self.info: dict = {}

    def rename(self, worker_id: str) -> None:
        """The worker joined (again) under ``worker_id``."""

    def work(self, polled: Work, working: Working) -> list[ev.Event]:
        raise NotImplementedError


class InferenceRole(Role):
    role = INFERENCE

    def __init__(self, worker) -> None:
        """``worker``: a ``runtime.workers.EngineWorker``."""
        from runtime.placement import joined_info
        from runtime.session import fingerprint

        super().__init__()
        self.worker = worker
        self.slots = worker.slots
        self.info = {"engine": worker.engine.batch_shape, "fingerprint": fingerprint(), "placement": joined_info()}

    @classmethod
    def of(cls, engine, task, codec, pstore, config: Config) -> InferenceRole:
        from runtime.workers import EngineWorker, last_version_loader

        return cls(EngineWorker("", engine, task, codec, last_version_loader(pstore),
                                slots=config.workers.inference_slots))

    def rename(self, worker_id: str) -> None:
        self.worker.worker_id = worker_id

    def work(self, polled, working):
        if not polled.leases:
            return []
        working.set(rollouts=[lease.rollout_id for lease in polled.leases])
        return list(self.worker.generate(polled.leases))


class VerifierRole(Role):
    role = VERIFIER

    def __init__(self, task, codec) -> None:
        from runtime.workers import TaskVerifier

        super().__init__()
        self.verifier = TaskVerifier("", task, codec)
        self.info = {"placement": {"devices": []}}  # it scores on the CPU and uses no device

    def work(self, polled, working):
        if not polled.scores:
            return []
        working.set(rollouts=[t.rollout_id for t in polled.scores])
        return list(self.verifier.score(polled.scores))


class TrainerRole(Role):
    role = TRAINER

    def __init__(self, trainer, gang=None) -> None:
        """``trainer``: a ``runtime.workers.StepTrainer``; ``gang``: the trainer gang this
        process is a rank of (``runtime.trainer.gang.Gang``), None for one process."""
        from runtime.placement import joined_info
        from runtime.session import fingerprint

        super().__init__()
        self.trainer = trainer
        self.gang = gang
        # the stack and layout this trainer's bits come from, and the devices it was given
        self.info = {"fingerprint": fingerprint(), "placement": joined_info()}

    def work(self, polled, working):
        if polled.train is None:
            return []
        if self.gang is not None:  # the other ranks run the same step
            from runtime.service import wire

            self.gang.hand_out(wire.train_to_proto(polled.train).SerializeToString())
        return self.run(polled.train, working)

    def run(self, task: TrainTask | InitTask, working: Working | None = None) -> list[ev.Event]:
        init = isinstance(task, InitTask)
        if working is not None:
            working.set(steps=[0 if init else task.step])  # type: ignore[union-attr]
        if isinstance(task, InitTask):
            return [self.trainer.initialize(task)]
        return list(self.trainer.train(task))

    def follow(self, log: Log) -> int:
        """A rank other than 0: run the steps rank 0 hands out until it says the run finished."""
        from runtime._generated import rlx_controller_pb2 as pb
        from runtime.service import wire

        assert self.gang is not None
        while (payload := self.gang.take()) is not None:
            message = pb.TrainTask()
            message.ParseFromString(payload)
            self.run(wire.train_from_proto(message))
        log(f"rank {self.gang.rank}: the run has finished")
        return 0


def role_from_config(role: str, config: Config, params_url: str, log: Log, gang=None) -> Role:
    """``role`` built from the run's config alone, as a worker process builds it: an engine for
    inference (no warm start: every version it uses comes from the parameter store), the task's
    verifier without a model, the model and train step for the trainer."""
    from runtime.config import DETERMINISTIC
    from runtime.params import ParamStore
    from runtime.placement import check_process
    from runtime.session import build_scoring, build_session, make_trainer

    if role != VERIFIER:
        check_process(config.scheduling.mode == DETERMINISTIC)
    if role == INFERENCE:
        # an episode's Python tool runs in the code sandbox of the run's verifier.isolation
        session = build_session(config, log=log, judge="python" in config.episodes.tools, warm=False)
        return InferenceRole.of(session.engine, session.task, session.codec, ParamStore.open(params_url), config)
    if role == VERIFIER:
        return VerifierRole(*build_scoring(config, log=log))  # no model, no engine: nothing to compile
    session = build_session(config, log=log, judge=False, engine=False)  # a trainer samples nothing
    return TrainerRole(make_trainer(session, ParamStore.open(params_url), "", gang=gang), gang)


def roles_from_session(session, pstore) -> list[tuple[str, Role]]:
    """Every worker of the run's ``workers`` section as ``(worker id, role)``, built from the
    host's ``session`` (threads of one process share its model and task): the first inference
    worker takes the session's engine, the others engines of the same shape (the same bits)."""
    from runtime.session import make_trainer

    config = session.config
    w = config.workers
    roles: list[tuple[str, Role]] = [("trainer-0", TrainerRole(make_trainer(session, pstore, "trainer-0")))]
    roles += [(f"verifier-{i}", VerifierRole(session.task, session.codec)) for i in range(w.verifiers)]
    roles += [(f"inference-{i}", InferenceRole.of(session.engine if i == 0 else session.new_engine(), session.task,
                                                   session.codec, pstore, config)) for i in range(w.inference)]
    return roles


__all__ = ["InferenceRole", "Role", "TrainerRole", "VerifierRole", "Working", "role_from_config",
           "roles_from_session"]
