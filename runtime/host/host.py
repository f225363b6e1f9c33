"""One run hosted in this process: the controller over the ledger, its front, retirer,
observers and watch loop — the same for ``rlx run``, ``rlx resume`` and ``rlx controller``.

A host creates a run or continues one under a new writer epoch (fencing any older controller);
serves it to workers through its :class:`~runtime.host.front.Front` (directly to worker threads,
over gRPC to worker processes); lets observers listen to its commits (the held-out evaluator, the
TensorBoard log); and watches until the run finishes: deleting retired versions, turning silence
into lease expiries, noticing a newer controller, and showing progress. Which runner starts the
workers, if any, is the caller's choice (``runtime.host.threads``, ``runtime.service.processes``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ledger import events as ev
from ledger.errors import CorruptLedger
from runtime.config import Config
from runtime.errors import UsageError
from runtime.host import admission
from runtime.host.front import Front
from runtime.host.retire import Retirer

Log = Callable[[str], None]
EXPIRE_EVERY_S = 1.0


class Host:
    """A run's controller in this process, with what serves and watches it (see the module
    docstring). Build with :meth:`create`, :meth:`resume` or :meth:`open`."""

    def __init__(self, ctrl, pstore, config: Config, retirer: Retirer, log: Log):
        self.ctrl = ctrl
        self.pstore = pstore
        self.config = config
        self.retirer = retirer
        self.log = log
        self.front = Front(ctrl, config=config.to_dict(), params_url=pstore.url, params=pstore,
                           bounds=admission.bounds(config))
        self.evaluator: Any = None
        self.metrics: Any = None

    @staticmethod
    def _options(config: Config, retirer: Retirer, log: Log) -> dict:
        return {"lease_timeout_s": config.workers.lease_timeout_s, "on_retire": retirer,
                "snapshot_every": config.ledger.snapshot_every, "warn": log}

    @classmethod
    def create(cls, store, pstore, config: Config, *, fingerprint: dict, log: Log) -> Host:
        """Create the run ``config.run.name`` (a resolved config) in ``store``, at writer epoch 1."""
        from runtime.controller import ControllerLoop

        retirer = Retirer(pstore)
        ctrl = ControllerLoop.create(store, run_id=config.run.name, config=config.to_dict(),
                                     config_digest=config.digest(), seed=config.run.seed, fingerprint=fingerprint,
                                     **cls._options(config, retirer, log))
        return cls(ctrl, pstore, config, retirer, log)

    @classmethod
    def resume(cls, store, pstore, run_id: str, *, fingerprint: dict, log: Log, start=None,
               check: bool = True) -> Host:
        """Continue run ``run_id`` under a new writer epoch: fold its ledger (from ``start``, a
        fold ``snapshot.recover`` made, or from the newest usable snapshot; every decision checked
        with ``check``) and queue the retired versions a crash left in the parameter store."""
        from runtime.controller import ControllerLoop
        from runtime.inputs import located
        from runtime.rundir import logged_run

        started = logged_run(store, run_id)  # served to the workers with the input paths the run recorded
        config = located(Config.from_dict(started.config), started.fingerprint)
        retirer = Retirer(pstore)
        try:
            ctrl = ControllerLoop.resume(store, run_id, check=check, fingerprint=fingerprint, start=start,
                                         **cls._options(config, retirer, log))
        except CorruptLedger as e:
            raise UsageError(f"ledger of run {run_id!r} is corrupt at seq {e.seq}: {e.reason}; `rlx ledger verify` "
                             "tells whether it is a torn tail, which `rlx ledger repair` can cut") from None
        retirer(ctrl.evictable_versions(pstore.versions()))  # deleted once the evaluator has what it needs
        return cls(ctrl, pstore, config, retirer, log)

    @classmethod
    def open(cls, store, params_url: str, *, run_id: str | None, config: Callable[[], Config],
             fingerprint: dict, log: Log) -> Host:
        """Continue run ``run_id`` if ``store`` holds it, else create the run of ``config()``
        (called only then; its ``run.name`` is ``run_id`` when one is given) — ``rlx controller``.

        A continued run's parameter store is not swept, unlike ``rlx resume``'s: the controller
        being replaced does not take the workers with it, and a trainer's put in flight looks
        exactly like a killed put's leftovers. What a killed put leaves is rewritten when its step
        is trained again (the same weights go under the same keys)."""
        from runtime.params import ParamStore
        from runtime.session import make_task, resolve

        if run_id is not None and run_id in store.runs():
            name = run_id
            fresh = None
        else:
            fresh = config()
            name = fresh.run.name
        if name in store.runs():
            host = cls.resume(store, ParamStore.open(params_url), name, fingerprint=fingerprint, log=log, check=False)
            log(f"continuing run {name!r} at step {host.ctrl.state.trained} (writer epoch {host.ctrl.epoch})")
            return host
        assert fresh is not None
        host = cls.create(store, ParamStore.open(params_url, create=True), resolve(fresh, make_task(fresh)),
                          fingerprint=fingerprint, log=log)
        log(f"created run {name!r} (writer epoch {host.ctrl.epoch})")
        return host

    # -- observers --------------------------------------------------------------------------------

    def observe(self, *, engine=None, task=None, codec=None) -> None:
        """Start the observers of the run's commits: the held-out evaluator (given an ``engine``
        of its own, and when ``eval.every_steps`` makes any version due) and the TensorBoard log
        (``log.tensorboard``)."""
        from runtime.evaluation import Evaluator

        hooks = []
        spec = self.ctrl.state.spec
        if engine is not None and spec is not None and spec.eval_every > 0:
            self.evaluator = Evaluator(engine=engine, task=task, codec=codec, pstore=self.pstore, ctrl=self.ctrl,
                                       retirer=self.retirer, config=self.config, log=self.log)
            hooks.append(self.evaluator.observe)
        if self.config.log.tensorboard is not None:
            from runtime.metrics_log import TensorBoardLog

            self.metrics = TensorBoardLog(self.config.log.tensorboard)
            hooks.append(self.metrics.observe)
            self.log(f"TensorBoard logs in {self.config.log.tensorboard}")
        if hooks:
            def on_commit(events: list[ev.Event]) -> None:
                for hook in hooks:
                    hook(events)

            self.ctrl.on_commit = on_commit
        if self.evaluator is not None:
            self.evaluator.start()

    def close(self, *, finished: bool) -> None:
        """Stop the observers: when the run ``finished``, after the evaluations it has due (the
        final version's is submitted after ``RunFinished``); else at once."""
        try:
            if self.evaluator is not None:
                self.evaluator.close(wait=finished)
        finally:
            if self.metrics is not None:
                self.metrics.close()
            self.retirer.sweep()

    # -- the watch loop ---------------------------------------------------------------------------

    def watch(self, *, progress: bool, stopped: Callable[[], bool] = lambda: False,
              tick: Callable[[], None] = lambda: None, beat: Callable[[], None] = lambda: None,
              wait: Callable[[float], object] = time.sleep) -> None:
        """Until the run finishes or ``stopped()``: delete retired versions, call ``tick``, expire
        silent leases and notice a newer controller every ``EXPIRE_EVERY_S``, show progress, and
        say in one line what the run waits for once it has made no progress for
        ``workers.no_progress_s``. ``beat`` is called just before each expiry with no worker's
        call in between (a runner's heartbeats for workers that live as long as this process)."""
        ctrl = self.ctrl
        last = time.monotonic()
        bar = _Progress(ctrl, self.config.run.steps) if progress else None
        stall = _Stall(ctrl, self.config.workers.no_progress_s, self.log, last)
        try:
            while not ctrl.finished and not stopped():
                wait(0.2)
                self.retirer.sweep()
                now = time.monotonic()
                due = now - last >= EXPIRE_EVERY_S
                if due:
                    last = now
                    ctrl.check_fenced()
                tick()
                if due:
                    with ctrl.exclusive():
                        beat()
                        ctrl.expire()
                    stall.check(now)
                if bar is not None:
                    bar.update(now)
        finally:
            if bar is not None:
                bar.stop()
            self.retirer.sweep()


class _Stall:
    """Says once, in one line, what a run waits for when it has made no progress (no accepted
    completion, outcome, step or version: ``ControllerLoop.advanced``) for ``limit_s`` (0:
    never); again after the run has moved on and stalled anew. Only words: nothing decided
    reads this clock."""

    def __init__(self, ctrl, limit_s: float, log: Log, now: float):
        self.ctrl, self.limit_s, self.log = ctrl, limit_s, log
        self.seen, self.since, self.told = ctrl.advanced, now, False

    def check(self, now: float) -> None:
        advanced = self.ctrl.advanced
        if advanced != self.seen:
            self.seen, self.since, self.told = advanced, now, False
        elif self.limit_s > 0 and not self.told and now - self.since >= self.limit_s:
            self.told = True
            self.log(f"warning: run {self.ctrl.run_id!r} has made no progress for {now - self.since:.0f} s "
                     f"(workers.no_progress_s): waiting for {self.ctrl.waiting_for()}")


class _Progress:
    """The run's steps, reward, pass rate and token rate, shown on stderr (``runtime.progress``)."""

    def __init__(self, ctrl, steps: int):
        from runtime.progress import Progress

        self.ctrl = ctrl
        self.t0, self.tokens0 = time.monotonic(), ctrl.completed_tokens
        self.bar = Progress("run", steps)

    def update(self, now: float) -> None:
        ctrl = self.ctrl
        m = ctrl.last_metrics
        rate = (ctrl.completed_tokens - self.tokens0) / max(now - self.t0, 1e-9)
        info = (f"reward {m.get('reward_mean', 0):.3f}, pass {m.get('pass_rate', 0):.1%}, "
                f"{rate:,.0f} tok/s") if m else "starting"
        self.bar.update(ctrl.state.trained, info)

    def stop(self) -> None:
        self.bar.update(self.ctrl.state.trained, self.bar.info)
        self.bar.close(finished=self.ctrl.finished)


__all__ = ["Host"]
