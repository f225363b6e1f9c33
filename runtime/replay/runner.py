"""``rlx replay``: re-derive a run from its ledger and compare every bit.

Stages, each stopping the replay when it fails:

1. the ledger's hash chain verifies;
2. folding the log re-decides every controller decision identically (I6);
3. the session is rebuilt from the logged config (same task, tokenizer, warm start — cached and
   deterministic — and engine shape), version 0 is re-created and every committed train step is
   re-run from its logged batch with the run's own ``StepTrainer``, comparing each step's batch
   digest, metrics and weights digest; with ``regenerate`` every accepted rollout is re-sampled
   from its version's re-derived weights and compared token by token and log-prob bit by bit.

The run's parameter store is only read: it must hold every version the ledger retains, with the
logged digests. Re-derived versions go to a private in-memory store, from which versions are
deleted where the run retired them, so the trainer sees what it saw in the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from runtime.errors import UsageError
from runtime.replay.divergence import Divergence, compare_rollout, compare_step, compare_version0, fingerprint_diff
from runtime.replay.plan import ReplayPlan, SampledRollout, StepPlan, plan_replay, replay_start
from runtime.replay.report import ReplayReport, ordered
from runtime.replay.source import open_params, read_run
from runtime.rundir import RunDir

Log = Callable[[str], None]


def _quiet(message: str) -> None:
    del message


def replay_run(directory: str, *, run_id: str | None = None, from_version: int = 0, regenerate: bool = False,
               log: Log = _quiet, warn: Log = _quiet) -> ReplayReport:
    """Replay the run in ``directory`` (see the module docstring).

    Args:
      directory: the run directory (``ledger.db``, ``params/``).
      run_id: the run, when the ledger holds several.
      from_version: re-train from the newest version at or before this one that the run kept
        (``replay_start``; ``params.keep_every`` keeps checkpoints), loaded from the run's
        parameter store and checked against the ledger's digest; 0 rebuilds version 0.
      regenerate: also re-sample every rollout from a re-derived version.
      log: progress lines.
      warn: called once when the current fingerprint differs from the recorded one.

    Raises:
      UsageError: bad directory, run or ``from_version``.
    """
    from runtime.controller import ReplayDivergence, replay
    from runtime.session import fingerprint

    t0 = time.monotonic()
    start = from_version  # until the plan says which kept version re-training starts from
    source = read_run(directory, run_id)
    run_id = source.run_id

    def report(divergences: list[Divergence], *, steps_total: int = 0, verified: int = 0,
               final: tuple[int, str] | None = None, regenerated: int = 0, fp: dict | None = None) -> ReplayReport:
        return ReplayReport(run_id, start, steps_total, verified, final and final[0], final and final[1],
                            regenerated, ordered(divergences), fp or {}, time.monotonic() - t0, from_version)

    if not source.chain.ok:
        c = source.chain
        return report([Divergence("ledger", c.first_bad_seq or 0, source.first_bad_kind or "missing", "chain",
                                  f"hash chain: {c.reason}")])
    plan = plan_replay(source.events)
    # Replay re-trains from logged outcomes and judges nothing: the code sandbox is not compared.
    recorded = {k: v for k, v in plan.run.fingerprint.items() if k != "sandbox"}
    fp = fingerprint_diff(recorded, fingerprint())
    if fp:
        warn(f"the environment differs from the one recorded in RunStarted ({', '.join(fp)}): "
             "bits may differ on another stack")
    last = plan.steps[-1].step if plan.steps else 0
    if type(from_version) is not int or not 0 <= from_version <= last or from_version not in plan.versions:
        raise UsageError(f"--from-version {from_version!r} is not accepted; run {run_id!r} has versions 0..{last}")
    start = replay_start(plan, from_version)
    if start != from_version:
        log(f"version {from_version} is not kept: re-training from version {start}, the nearest kept before it")

    url = RunDir(directory).logged_params(plan.run.config)
    pstore = open_params(url)
    divergences = _check_stored(plan, pstore, url)
    log(f"folding {len(source.events)} events of run {run_id!r} with decision checks")
    try:
        replay(source.events, check=True)
    except ReplayDivergence as e:
        divergences.append(Divergence("controller", e.seq, e.kind, e.field, str(e)))
        return report(divergences, steps_total=len(plan.steps), fp=fp)

    rerun = _Rerun(plan, directory, pstore, log)
    if regenerate:
        for shape in recorded_engine_shapes(source.events):
            rebuilt = rerun.session.engine.batch_shape
            differs = sorted(k for k in set(shape) | set(rebuilt) if shape.get(k) != rebuilt.get(k))
            if differs:
                warn(f"the rebuilt engine's batch shape differs from the run's ({', '.join(differs)}): "
                     "re-sampled bits may differ")
    divergences += rerun.start(start)
    if not rerun.stopped:
        if regenerate:
            divergences += rerun.regenerate(start)
        for step in plan.steps:
            if step.step <= start:
                continue
            divergences += rerun.train(step)
            if rerun.stopped:
                break
            if regenerate:
                divergences += rerun.regenerate(step.step)
    return report(divergences, steps_total=len(plan.steps), verified=rerun.verified, final=rerun.final,
                  regenerated=rerun.regenerated, fp=fp)


def recorded_engine_shapes(events) -> list[dict]:
    """The distinct engine batch shapes inference workers recorded when they joined."""
    shapes = []
    for stored in events:
        e = stored.event
        if e.KIND == "WorkerJoined" and e.role == "inference" and isinstance(e.info.get("engine"), dict):
            shape = {k: list(v) if isinstance(v, tuple) else v for k, v in e.info["engine"].items()}
            if shape not in shapes:
                shapes.append(shape)
    return shapes


def _check_stored(plan: ReplayPlan, pstore, url: str) -> list[Divergence]:
    """The run's parameter store holds every retained version with its logged digest (I8)."""
    from runtime.params import ParamStoreError

    stored = set(pstore.versions()) if pstore is not None else set()
    out = []
    for v in plan.retained:
        pub = plan.versions[v]
        if v not in stored:
            out.append(Divergence("params", pub.seq, pub.event.KIND, "stored",
                                  f"version {v} is retained by the run but missing from the parameter store {url}",
                                  version=v))
            continue
        try:
            digest = pstore.verify(v)
        except ParamStoreError as e:
            out.append(Divergence("params", pub.seq, pub.event.KIND, "stored", f"stored version {v} is unreadable: {e}",
                                  version=v))
            continue
        if digest != pub.event.digest:
            out.append(Divergence("params", pub.seq, pub.event.KIND, "digest",
                                  f"stored version {v} has digest {digest[:16]}…, the ledger {pub.event.digest[:16]}…",
                                  version=v))
    return out


class _Rerun:
    """The session, a private parameter store and the run's workers, re-running versions in order."""

    def __init__(self, plan: ReplayPlan, directory: str, pstore, log: Log):
        import tensorstore as ts

        from runtime.config import Config
        from runtime.params import ParamStore
        from runtime.session import build_session
        from runtime.workers import EngineWorker, StepTrainer

        self.plan, self.pstore, self.log = plan, pstore, log
        config = Config.from_dict(plan.run.config)
        self.session = session = build_session(config, log=log, judge=False)
        # A private context: the replay's versions never mix with any other memory:// store.
        self.store = ParamStore.open("memory://replay/", context=ts.Context())
        self.trainer = StepTrainer("replay-trainer", session.model, session.task, session.codec, self.store,
                                   session.step_config, group_size=config.sampling.group_size,
                                   width=session.width)
        self.sampler = EngineWorker("replay-inference", session.engine, session.task, session.codec,
                                    lambda v: (self.store.get(v), self.store.digest(v)))
        self.verified = 0
        self.regenerated = 0
        self.final: tuple[int, str] | None = None
        self.stopped = False

    def start(self, version: int) -> list[Divergence]:
        """Version 0 rebuilt, or ``version`` (and older versions later steps read) from the run's store."""
        from runtime.controller import InitTask
        from runtime.params import params_digest

        v0 = self.plan.versions[0]
        if version == 0:
            digest = self.trainer.initialize(InitTask()).digest
            self.final = (0, digest)
            found = compare_version0(v0, digest)
            self.stopped = found is not None
            self.verified += not self.stopped
            return [found] if found else []
        # Version 0 stays the KL / preference reference of every step.
        reference = compare_version0(v0, params_digest(self.session.model.params))
        self._copy(version, opt_state=True)
        self.final = (version, self.plan.versions[version].event.digest)
        for step in self.plan.steps:
            if step.step > version:
                for v in sorted(step.row_versions() - step.unavailable):
                    if 0 < v < version and v not in self.store.versions():
                        self._copy(v, opt_state=False, needed_by=step.step)
        return [reference] if reference else []

    def _copy(self, version: int, *, opt_state: bool, needed_by: int | None = None) -> None:
        pub = self.plan.versions[version]
        if self.pstore is None or version not in self.pstore.versions():
            why = f", needed for the old log-probs of step {needed_by}," if needed_by else ""
            raise UsageError(f"version {version}{why} is not in the run's parameter store; "
                             f"replay from an earlier version (0 needs none)")
        if self.pstore.verify(version) != pub.event.digest:
            raise UsageError(f"stored version {version} does not have the digest the ledger names; "
                             "replay from an earlier version")
        params = self.pstore.get(version)
        opt = self.pstore.get_opt_state(version) if opt_state else None
        self.store.put(version, params, opt)

    def train(self, step: StepPlan) -> list[Divergence]:
        """Re-run one step; stops the replay when its weights differ."""
        present = set(self.store.versions())
        for v in sorted(step.unavailable & present):
            self.store.delete(v)
        trained, published = self.trainer.train(step.task)
        self.final = (step.step, published.digest)
        found = compare_step(step, trained, published)
        differs = any(d.kind == published.KIND for d in found)
        self.stopped = differs
        self.verified += not differs
        self.log(f"step {step.step}: digest {published.digest[:16]} {'differs' if differs else 'matches'}"
                 f"{' (step metrics differ)' if found and not differs else ''}")
        return found

    def regenerate(self, version: int) -> list[Divergence]:
        """Re-sample every accepted rollout of ``version`` and compare it with the logged one."""
        sampled: tuple[SampledRollout, ...] = self.plan.rollouts.get(version, ())
        if not sampled:
            return []
        got = {c.rollout_id: c for c in self.sampler.generate([r.lease for r in sampled])}
        self.regenerated += len(sampled)
        out = [d for r in sampled if (d := compare_rollout(r, got[r.lease.rollout_id])) is not None]
        self.log(f"version {version}: re-sampled {len(sampled)} rollouts, {len(out)} differ")
        return out

