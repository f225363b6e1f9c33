"""``rlx run``: a whole run — the controller, and inference, verifier and trainer workers.

The controller (``runtime.controller.ControllerLoop``) is the only writer of the ledger and lives
in this process. The workers are, by default (``workers.mode = "processes"``), ``rlx worker ROLE``
processes that this process supervises and serves over gRPC on loopback
(``runtime.service``): a dead one is noticed at once, its loss recorded and a new one started.
With ``workers.mode = "threads"`` they are threads of this process calling the same controller
methods. Either way inference workers take leases and submit completions, verifiers score
completed rollouts, and the trainer publishes version 0 and runs each step as its batch forms;
this process's main thread only watches: it shows progress, heartbeats for its threads and turns
silence into lease expiries.

Everything that decides is in the ledger or a pure function of it, so the final weights depend on
(config, seed, data, software stack) only in deterministic mode — not on timing, on processes or
threads, on how many workers there are, or on how many of them were killed.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import threading
import time
from collections.abc import Callable, Iterable

from ledger import events as ev
from ledger import open_store
from runtime.config import PROCESSES, Config
from runtime.errors import UsageError
from runtime.rundir import RunDir, run_started
from runtime.session import Session, build_session, build_task, fingerprint, make_trainer, step_config


class _Workers:
    """The worker threads of one process; the first error stops them all.

    A worker that found nothing to do sleeps until another one did something (every change of
    the controller's state comes from some worker's call), or at most ``idle_s``: idle workers do
    not spin on the controller's lock.
    """

    def __init__(self, idle_s: float = 0.05) -> None:
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.threads: list[threading.Thread] = []
        self.idle_s = idle_s
        self._changed = threading.Condition()
        self._generation = 0

    def spawn(self, name: str, body: Callable[[], bool]) -> None:
        """Run ``body`` until stopped; it returns False when it found nothing to do."""

        def loop() -> None:
            try:
                while not self.stop.is_set():
                    seen = self._generation
                    if body():
                        with self._changed:
                            self._generation += 1
                            self._changed.notify_all()
                    else:
                        with self._changed:
                            if self._generation == seen and not self.stop.is_set():
                                self._changed.wait(self.idle_s)
            except BaseException as e:  # surfaced by the main thread
                self.error = e
                self.stop.set()

        t = threading.Thread(target=loop, name=name, daemon=True)
        self.threads.append(t)
        t.start()

    def join(self) -> None:
        self.stop.set()
        with self._changed:
            self._changed.notify_all()
        for t in self.threads:
            t.join()


def run(config: Config, out: str, *, progress: bool = True, log: Callable[[str], None] = print) -> dict:
    """Run ``config`` into directory ``out``; return the summary (also in ``out/summary.json``)."""
    from runtime.controller import ControllerLoop
    from runtime.params import ParamStore

    rundir = RunDir(out)
    ledger_url = rundir.new_ledger(config.ledger.url)
    params_url = rundir.params(config.params.url)
    t_start = time.monotonic()
    _check_new_run(rundir, ledger_url, params_url, config.run.name)  # before anything is built or written
    _check_shareable(config, params_url)
    # The data and the code sandbox are settled first: the sandbox's probes fork, which must not
    # happen while the workers' first calls are in flight in this process's gRPC threads.
    built = build_task(config, log=log)
    # Worker processes start now and build their roles while this process builds its own session.
    workers = _WorkerProcesses(config, out) if config.workers.mode == PROCESSES else None
    try:
        session = build_session(config, log=log, built=built)  # validates model, data and task
        config = config.resolved(data_size=session.task.train_size,
                                 chat_template_digest=session.codec.template_digest)
        # The train step follows the resolved config, which is what RunStarted records.
        session = dataclasses.replace(session, config=config, step_config=step_config(config, session.model))
        os.makedirs(out, exist_ok=True)
        store = open_store(ledger_url, create=True, synchronous=config.ledger.synchronous)
    except BaseException:
        if workers is not None:
            workers.abandon()  # a run refused before it was recorded leaves nothing behind
        raise
    try:
        if config.ledger.url is not None:  # resume, replay and audit of `out` find the ledger through it
            rundir.point_to(ledger_url, config.run.name)
        pstore = ParamStore.open(params_url, create=True)
        retirer = _Retirer(pstore)
        ctrl = ControllerLoop.create(
            store, run_id=config.run.name, config=config.to_dict(), config_digest=config.digest(),
            seed=config.run.seed, fingerprint=_fingerprint(session), lease_timeout_s=config.workers.lease_timeout_s,
            on_retire=retirer, snapshot_every=config.ledger.snapshot_every, warn=log,
        )
        return _drive(session, config, out, store, pstore, ctrl, retirer, t_start, progress, log, workers)
    finally:
        if workers is not None:
            workers.stop()  # when the run did not get as far as running them
        store.close()


def _fingerprint(session: Session) -> dict:
    """What ``RunStarted`` records of this machine: the stack the bits depend on, the trainer's
    layout (its processes, the devices of each, its mesh and, for a gang, the collectives that sum
    across processes: the workers this process starts get its environment) and, for a task that
    runs code, the sandbox's isolation and how each limit binds. ``rlx resume`` warns when any of
    it differs."""
    import jax

    from runtime.config import MeshShape

    processes = session.config.workers.trainer_processes
    trainer = {
        "processes": processes, "devices_per_process": jax.local_device_count(),
        "mesh": MeshShape.of(session.config.trainer.mesh).describe(),
        "collectives": jax.config.values["jax_cpu_collectives_implementation"] if processes > 1 else None,
    }
    return {**fingerprint(), "trainer": trainer, **({} if session.sandbox is None else {"sandbox": session.sandbox})}


def _check_new_run(rundir: RunDir, ledger_url: str, params_url: str, run_name: str) -> None:
    """Refuse, before anything is built or written, a run that could not be recorded: an output
    path that cannot be a directory, a ledger that is not one or cannot be reached, a run name
    the ledger already holds, a parameter store URL that cannot name a store."""
    from ledger.store import resolve_url
    from runtime.params.location import parse_location

    rundir.check_creatable()
    if "://" not in ledger_url and os.path.isdir(ledger_url):  # resolve_url would look inside it
        raise UsageError(f"the ledger {ledger_url!r} is a directory; give a ledger file, or another --out")
    url = resolve_url(ledger_url)
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        # A directory named by a sqlite:/// URL is refused by the store itself, in one line.
        existing = open_store(url, readonly=True) if os.path.exists(path) else None
    else:  # a server: reachable now, not after the model is built
        existing = open_store(url, create=True)
    if existing is not None:
        with existing:
            if run_name in existing.runs():
                raise UsageError(f"run {run_name!r} already exists in {existing.url}; continue it with "
                                 f"`rlx resume {rundir.path}`, or choose another --out or run.name")
    location = parse_location(params_url)
    if location.directory is not None and os.path.exists(location.directory) and not os.path.isdir(location.directory):
        raise UsageError(f"the parameter store {params_url!r} is not a directory")


def _check_shareable(config: Config, params_url: str) -> None:
    """Worker processes read and write the parameter store: it cannot live in one process's memory."""
    if config.workers.mode == PROCESSES and params_url.startswith("memory://"):
        raise UsageError(f"params.url {params_url!r} lives in one process's memory, which worker processes cannot "
                         'read; use a file:// store or workers.mode="threads"')


def resume(out: str, *, run_id: str | None = None, progress: bool = True,
           log: Callable[[str], None] = print) -> dict | None:
    """Continue the run in ``out`` after a crash or kill: fold the ledger, take a new writer epoch,
    clean up half-written parameter versions and go on. Returns None if the run had finished."""
    from ledger.errors import CorruptLedger
    from runtime.controller import ControllerLoop, snapshot
    from runtime.params import ParamStore
    from runtime.replay.divergence import fingerprint_diff

    t_start = time.monotonic()
    rundir = RunDir(out)
    with open_store(out, readonly=True) as reader:
        run_id = rundir.select_run(reader, run_id)
        first = run_started(reader, run_id)
    config = Config.from_dict(first.config)
    store = open_store(out, synchronous=config.ledger.synchronous)
    try:
        params_url = rundir.logged_params(first.config)
        _check_shareable(config, params_url)
        pstore = ParamStore.open(params_url)
        # One pass over the log's tail: from the newest usable snapshot, chain-checked, decisions
        # checked, state and payload cache folded; the controller continues this fold.
        try:
            recovered = snapshot.recover(store, run_id, warn=log)
        except CorruptLedger as e:
            raise UsageError(f"ledger of run {run_id!r} is corrupt at seq {e.seq}: {e.reason}; `rlx ledger verify` "
                             "tells whether it is a torn tail, which `rlx ledger repair` can cut") from None
        state = recovered.state
        if state.finished:
            log(f"run {run_id!r} has already finished (version {state.latest}); nothing to resume")
            return None
        session = build_session(config, log=log)
        swept = pstore.sweep()
        if swept:
            log(f"removed {len(swept)} half-written parameter version(s) left by the crash")
        missing = [v for v in sorted(state.versions) if v not in pstore.versions()]
        if state.latest >= 0 and state.latest in missing:
            raise UsageError(
                f"version {state.latest} is in the ledger but missing from the parameter store {params_url}; "
                "`rlx replay` re-derives it"
            )
        here = _fingerprint(session)
        changed = fingerprint_diff(first.fingerprint, here)
        if changed:
            what = ", ".join(f"{k} {v['recorded']!r} → {v['current']!r}" for k, v in changed.items())
            log(f"warning: this machine differs from the one recorded in RunStarted ({what}): the steps "
                "trained from here are valid, but their bits may differ from an uninterrupted run's")
        retirer = _Retirer(pstore)
        ctrl = ControllerLoop.resume(store, run_id, fingerprint=here, start=recovered, warn=log,
                                     lease_timeout_s=config.workers.lease_timeout_s, on_retire=retirer,
                                     snapshot_every=config.ledger.snapshot_every)
        retirer(ctrl.evictable_versions(pstore.versions()))  # deleted once the evaluator has what it needs
        since = f"snapshot at seq {recovered.snapshot_seq}" if recovered.snapshot_seq else "seq 1"
        log(f"resumed run {run_id!r} at step {ctrl.state.trained} of {config.run.steps} "
            f"(writer epoch {ctrl.epoch}, ledger head seq {ctrl.head_seq}, folded from {since})")
        return _drive(session, config, out, store, pstore, ctrl, retirer, t_start, progress, log)
    finally:
        store.close()


class _Retirer:
    """Deletes retired versions from the parameter store, outside the controller's lock.

    The controller calls it (``on_retire``) with each committed ``VersionsRetired``; that only
    queues the versions. ``sweep`` deletes them, from the main thread, so file I/O never holds up
    the workers' calls. Versions a crash left undeleted are found by ``evictable_versions`` on resume.
    """

    def __init__(self, pstore) -> None:
        self.pstore = pstore
        self._queued: list[int] = []
        self._held: dict[int, int] = {}  # version -> holds: not deleted until released
        self._lock = threading.Lock()

    def __call__(self, versions: Iterable[int]) -> None:
        with self._lock:
            self._queued.extend(versions)

    def hold(self, version: int) -> None:
        """Keep ``version`` in the store until :meth:`release` (the evaluator has yet to load it)."""
        with self._lock:
            self._held[version] = self._held.get(version, 0) + 1

    def release(self, version: int) -> None:
        with self._lock:
            n = self._held.pop(version, 0) - 1
            if n > 0:
                self._held[version] = n

    def sweep(self) -> None:
        with self._lock:
            versions = [v for v in self._queued if v not in self._held]
            self._queued = [v for v in self._queued if v in self._held]
        if versions:
            present = set(self.pstore.versions())
            for v in versions:
                if v in present:
                    self.pstore.delete(v)


def _drive(session: Session, config: Config, out: str, store, pstore, ctrl, retirer: _Retirer, t_start: float,
           progress: bool, log: Callable[[str], None], workers: _WorkerProcesses | None = None) -> dict:
    """Run the workers (processes or threads, ``workers.mode``; processes already started in
    ``workers``, else started now) until the run finishes, with the held-out evaluator and the
    TensorBoard log listening (``_observers``); wait for the last due evaluation; evaluate
    versions 0 and final on the held-out split (after the run, so a resume goes back to work at
    once); write summary.json, report.png. The RL time counts from here: from when the controller
    is ready to when the run finished."""
    # Everything built so far (model, compiled programs, the folded state) lives for the whole
    # run: keep it out of the cyclic collector's passes until the run ends. The controller and
    # the worker threads allocate many short-lived, acyclic objects (events, leases, tuples):
    # collect the young generation 20,000 allocations apart instead of 700, which cut the time
    # every thread spends in the collector by about 5x in `scripts/bench_e2e.py`.
    evaluator, metrics = _observers(session, config, pstore, ctrl, retirer, log)
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], 20_000), *thresholds[1:])
    t_rl = time.monotonic()
    try:
        try:
            if config.workers.mode == PROCESSES:
                _run_processes(config, out, pstore, ctrl, retirer, progress, log, workers)
            else:
                _run_threads(session, config, pstore, ctrl, retirer, progress)
        except BaseException:
            if evaluator is not None:
                evaluator.close(wait=False)
            raise
        finally:
            gc.set_threshold(*thresholds)
            gc.unfreeze()
            retirer.sweep()
        rl_seconds = time.monotonic() - t_rl
        if evaluator is not None:
            evaluator.close()  # the final version's evaluation, submitted after RunFinished
            retirer.sweep()
    finally:
        if metrics is not None:
            metrics.close()
    state = ctrl.state
    final_version = state.latest
    final_digest = state.versions[final_version]
    eval_before = session.evaluate(pstore.get(0), limit=config.pretrain.eval_size)
    eval_after = session.evaluate(pstore.get(final_version), limit=config.pretrain.eval_size)
    log(f"held-out pass rate: {eval_before:.1%} before RL (version 0), {eval_after:.1%} after")
    summary = _summary(store, config, final_version, final_digest, eval_before, eval_after,
                       rl_seconds, time.monotonic() - t_start, ctrl.completed_tokens, session)
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
    from runtime.report import plot_report

    plot_report(summary, os.path.join(out, "report.png"))
    return summary


def _observers(session: Session, config: Config, pstore, ctrl, retirer: _Retirer, log: Callable[[str], None]):
    """The held-out evaluator (when ``eval.every_steps`` makes any version due) and the
    TensorBoard log (``log.tensorboard``), started and listening to the controller's commits."""
    from runtime.evaluation import Evaluator

    evaluator = metrics = None
    hooks = []
    spec = ctrl.state.spec
    if spec is not None and spec.eval_every > 0:
        # Processes mode leaves this process's engine idle during the run; threads mode lends it
        # to the first inference worker, so the evaluator gets one of the same shape.
        engine = session.engine if config.workers.mode == PROCESSES else session.new_engine()
        evaluator = Evaluator(engine=engine, task=session.task, codec=session.codec, pstore=pstore, ctrl=ctrl,
                              retirer=retirer, config=config, log=log)
        hooks.append(evaluator.observe)
    if config.log.tensorboard is not None:
        from runtime.metrics_log import TensorBoardLog

        metrics = TensorBoardLog(config.log.tensorboard)
        hooks.append(metrics.observe)
        log(f"TensorBoard logs in {config.log.tensorboard}")
    if hooks:
        def on_commit(events: list[ev.Event]) -> None:
            for hook in hooks:
                hook(events)

        ctrl.on_commit = on_commit
    if evaluator is not None:
        evaluator.start()
    return evaluator, metrics


def _run_threads(session: Session, config: Config, pstore, ctrl, retirer: _Retirer, progress: bool) -> None:
    """The roles as threads of this process; the first error stops the run.

    The watch loop heartbeats for every worker thread, naming what it has in hand, just before it
    expires silent leases: a thread is alive as long as this process is, so a generation or a
    step longer than the lease timeout keeps its worker and its leases. A worker found lost all
    the same joins again under a new id.
    """
    from runtime.controller import InitTask
    from runtime.workers import EngineWorker, TaskVerifier, last_version_loader

    inferences = [
        EngineWorker(f"inference-{i}", session.engine if i == 0 else session.new_engine(), session.task,
                     session.codec, last_version_loader(pstore), slots=config.workers.inference_slots)
        for i in range(config.workers.inference)
    ]
    verifiers = [TaskVerifier(f"verifier-{i}", session.task, session.codec) for i in range(config.workers.verifiers)]
    trainer = make_trainer(session, pstore, "trainer-0")
    in_hand: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}  # worker id -> (rollouts, steps)
    joins: dict[str, int] = {}

    def join(worker, role: str, **kwargs) -> None:
        """Join ``worker`` (again, under a new id, if it was lost)."""
        base = worker.worker_id.split("~")[0]
        n = joins[base] = joins.get(base, -1) + 1
        worker.worker_id = base if n == 0 else f"{base}~{n}"
        ctrl.join(worker.worker_id, role, **kwargs)

    # The engine's batch shape decides the bits of every completion: recorded for replays.
    for w in inferences:
        join(w, "inference", slots=w.slots, info={"engine": w.engine.batch_shape})
    for v in verifiers:
        join(v, "verifier")
    join(trainer, "trainer")

    def infer(inference) -> Callable[[], bool]:
        def body() -> bool:
            if not ctrl.joined(inference.worker_id):
                join(inference, "inference", slots=inference.slots, info={"engine": inference.engine.batch_shape})
            leases = ctrl.leases(inference.worker_id)
            if not leases:
                return False
            in_hand[inference.worker_id] = (tuple(lease.rollout_id for lease in leases), ())
            try:
                ctrl.complete(inference.generate(leases))
            finally:
                in_hand.pop(inference.worker_id, None)
            return True

        return body

    def verify(verifier) -> Callable[[], bool]:
        def body() -> bool:
            if not ctrl.joined(verifier.worker_id):
                join(verifier, "verifier")
            tasks = ctrl.scoring_work(verifier.worker_id, 512)
            if not tasks:
                return False
            in_hand[verifier.worker_id] = (tuple(t.rollout_id for t in tasks), ())
            try:
                ctrl.record_outcomes(verifier.score(tasks))
            finally:
                in_hand.pop(verifier.worker_id, None)
            return True

        return body

    def train() -> bool:
        if not ctrl.joined(trainer.worker_id):
            join(trainer, "trainer")
        task = ctrl.train_task(trainer.worker_id)
        if task is None:
            return False
        in_hand[trainer.worker_id] = ((), (0 if isinstance(task, InitTask) else task.step,))
        try:
            ctrl.publish([trainer.initialize(task)] if isinstance(task, InitTask) else list(trainer.train(task)))
        finally:
            in_hand.pop(trainer.worker_id, None)
        return True

    def heartbeat() -> None:
        ids = [w.worker_id for w in inferences] + [v.worker_id for v in verifiers] + [trainer.worker_id]
        for wid in ids:
            rollouts, steps = in_hand.get(wid, ((), ()))
            ctrl.heartbeat(wid, rollouts=rollouts, steps=steps)

    workers = _Workers()
    workers.spawn("trainer", train)
    for v in verifiers:
        workers.spawn(v.worker_id, verify(v))
    for w in inferences:
        workers.spawn(w.worker_id, infer(w))
    try:
        _watch(ctrl, retirer, config, progress, stopped=workers.stop.is_set, tick=heartbeat,
               wait=workers.stop.wait)
    finally:
        workers.join()
    if workers.error is not None:
        raise workers.error


class _WorkerProcesses:
    """The ``rlx worker`` processes of a processes-mode run and the loopback service they call,
    with a token of the run's own.

    ``run`` starts them before it builds its own session: their start-up (importing JAX,
    building their role, loading compiled programs) overlaps with its own instead of coming after
    it. Until ``attach`` gives the service its controller, their first calls wait
    (``PendingService``); they wait as long as this process builds, and exit with it.
    """

    RETRY_FOR_S = 24 * 3600.0

    def __init__(self, config: Config, out: str) -> None:
        import secrets

        from runtime.service.server import PendingService, serve
        from runtime.service.supervisor import Journal, Supervisor
        from verifiers.service.security import TOKEN_ENV, ListenAddress, ServerSecurity

        logs, journal = os.path.join(out, "logs"), os.path.join(out, "workers.jsonl")
        self._created = [p for p in (out, logs, journal) if not os.path.lexists(p)]
        self.ctrl = None
        self._stopped = False
        token = secrets.token_urlsafe(32)
        self.pending = PendingService()
        self.served = serve(self.pending, ListenAddress("127.0.0.1", 0), ServerSecurity(token=token))
        w = config.workers
        self.supervisor = Supervisor(
            f"127.0.0.1:{self.served.port}", [("trainer", 1), ("verifier", w.verifiers), ("inference", w.inference)],
            log_dir=logs, journal=Journal(journal), lose=self._lose, joined_ids=self._joined_ids,
            env={TOKEN_ENV: token}, retry_for_s=self.RETRY_FOR_S, gangs={"trainer": w.trainer_processes})
        try:
            self.supervisor.start()
        except BaseException:
            self.abandon()
            raise

    def _lose(self, ids, reason: str) -> None:
        if self.ctrl is not None:
            self.ctrl.lose(ids, reason)

    def _joined_ids(self) -> tuple[str, ...]:
        return () if self.ctrl is None else tuple(self.ctrl.state.workers.keys())

    def attach(self, ctrl, service) -> None:
        """Serve ``service`` (over ``ctrl``) to the workers."""
        self.ctrl = ctrl
        self.pending.attach(service)

    def stop(self) -> None:
        """Let the workers finish (they exit when the run has finished), stop the rest and the
        service. Workers that never had a controller are stopped at once."""
        from runtime.service.supervisor import STOP_GRACE_S

        if not self._stopped:
            self._stopped = True
            self.supervisor.stop(STOP_GRACE_S if self.ctrl is not None else 0.0)
            self.served.stop()

    def abandon(self) -> None:
        """Stop everything and remove what was created for the workers (their logs, the journal,
        the run directory if it was made for them): the run was never recorded."""
        import shutil

        self._stopped = True
        self.supervisor.stop(0.0)
        self.served.stop(0.0)
        for path in reversed(self._created):
            if os.path.isdir(path) and not os.path.islink(path):
                if os.path.basename(path) == "logs":
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    try:
                        os.rmdir(path)  # the run directory, when nothing else is in it
                    except OSError:
                        pass
            elif os.path.lexists(path):
                os.remove(path)


def _run_processes(config: Config, out: str, pstore, ctrl, retirer: _Retirer, progress: bool,
                   log: Callable[[str], None], workers: _WorkerProcesses | None = None) -> None:
    """The roles as ``rlx worker`` processes that this process supervises (``workers``, started
    by ``run`` while it built its session, or started now)."""
    from runtime.service.server import ControllerService

    if workers is None:
        workers = _WorkerProcesses(config, out)

    supervisor = workers.supervisor
    service = ControllerService(ctrl, config=config.to_dict(), params_url=pstore.url, params=pstore,
                                on_accept=supervisor.delivered)
    workers.attach(ctrl, service)
    log(f"workers: {len(supervisor.slots)} processes (their output in {os.path.join(out, 'logs')})")
    try:
        _watch(ctrl, retirer, config, progress,
               stopped=lambda: supervisor.failure is not None or service.fenced.is_set(), tick=supervisor.poll)
    finally:
        workers.stop()
    if supervisor.failure is not None:
        raise UsageError(supervisor.failure)
    if service.fenced.is_set():
        from runtime.controller.loop import ControllerFenced

        raise ControllerFenced(f"controller of run {ctrl.run_id!r} at epoch {ctrl.epoch} is fenced by a newer one")


def _watch(ctrl, retirer: _Retirer, config: Config, progress: bool, *, stopped: Callable[[], bool],
           tick: Callable[[], None], wait: Callable[[float], object] = time.sleep) -> None:
    """Wait for the run to finish, showing progress, calling ``tick`` and expiring silent leases."""
    steps = config.run.steps
    last_expire = time.monotonic()
    t0 = time.monotonic()
    tokens0 = ctrl.completed_tokens
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(TextColumn("[bold]step"), MofNCompleteColumn(), BarColumn(), TimeElapsedColumn(),
                       TextColumn("{task.fields[info]}"))
        bar.start()
        task_id = bar.add_task("rl", total=steps, info="")
    try:
        while not ctrl.finished and not stopped():
            wait(0.2)
            retirer.sweep()
            tick()
            now = time.monotonic()
            if now - last_expire > 1.0:
                ctrl.expire()
                last_expire = now
            if progress:
                m = ctrl.last_metrics
                rate = (ctrl.completed_tokens - tokens0) / max(now - t0, 1e-9)
                info = (f"reward {m.get('reward_mean', 0):.3f}  pass {m.get('pass_rate', 0):.1%}  "
                        f"{rate:,.0f} tok/s") if m else "starting"
                bar.update(task_id, completed=ctrl.state.trained, info=info)
    finally:
        if progress:
            bar.update(task_id, completed=ctrl.state.trained)
            bar.stop()


def _summary(store, config: Config, final_version: int, final_digest: str, eval_before: float,
             eval_after: float, rl_seconds: float, total_seconds: float, tokens: int, session: Session) -> dict:
    steps, rollouts, evaluations = [], 0, []
    started = None
    for s in store.read(config.run.name):
        e = s.event
        if isinstance(e, ev.TrainStepCompleted):
            steps.append({"step": e.step, **e.metrics})
        elif isinstance(e, ev.RolloutCompleted):
            rollouts += 1
        elif isinstance(e, ev.VersionEvaluated):
            evaluations.append({
                "version": e.version, "step": e.version, "digest": e.digest, "problems": e.problems,
                "greedy_pass_rate": e.greedy_pass_rate, "pass_at_k": e.pass_at_k, "k": e.k, "samples": e.samples,
                "sampled_pass_rate": e.sampled_pass_rate, "seq": s.seq,
                "wall_seconds": s.wall_time - (s.wall_time if started is None else started),
            })
        elif isinstance(e, ev.RunStarted):
            started = s.wall_time
    steps.sort(key=lambda m: m["step"])
    evaluations.sort(key=lambda m: m["version"])
    return {
        "run": config.run.name,
        "config_digest": config.digest(),
        "final_version": final_version,
        "final_digest": final_digest,
        "steps": len(steps),
        "eval_before": eval_before,
        "eval_after": eval_after,
        "eval_size": min(config.pretrain.eval_size, session.task.eval_size),
        "warm_start": session.warm_start,
        "rollouts": rollouts,
        "rollout_tokens": tokens,
        "rl_seconds": rl_seconds,
        "total_seconds": total_seconds,
        "steps_per_minute": 60.0 * len(steps) / max(rl_seconds, 1e-9),
        "rollout_tokens_per_s": tokens / max(rl_seconds, 1e-9),
        "reward_curve": [m.get("reward_mean") for m in steps],
        "pass_rate_curve": [m.get("pass_rate") for m in steps],
        "metrics": steps,
        "evaluations": evaluations,
    }


__all__ = ["resume", "run"]
