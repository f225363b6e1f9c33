"""``rlx replay``: re-derive a run from its ledger and compare every bit.

Stages, each stopping the replay when it fails:

1. the ledger's hash chain verifies;
2. folding the log re-decides every controller decision identically (I6); with
   ``check_snapshots`` every stored controller snapshot equals the fold at its seq, byte for byte;
3. the session is rebuilt from the logged config (same task, tokenizer, warm start — cached and
   deterministic — and engine shape), version 0 is re-created and every committed train step is
   re-run from its logged batch with the run's own ``StepTrainer``, comparing each step's batch
   digest, metrics and weights digest; with ``regenerate`` every accepted rollout is re-sampled
   from its version's re-derived weights and compared token by token and log-prob bit by bit.

Every stage streams the log (``runtime.replay.plan``): memory follows what the run held live
(the controller's state and payload cache, the versions it retained), not the log's length.

The run's parameter store is only read: it must hold every version the ledger retains, with the
logged digests. Re-derived versions go to a private in-memory store, without their optimizer
state (the next step trains from the state the trainer holds), from which versions are deleted
where the run retired them, so the trainer sees what it saw in the run.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from ledger import events as ev
from runtime import inputs as run_inputs
from runtime.config import Config
from runtime.errors import UsageError
from runtime.progress import Progress
from runtime.replay.divergence import Divergence, compare_rollout, compare_step, compare_version0, fingerprint_diff
from runtime.replay.plan import ReplayIndex, Sampled, StepPlan, index_run, replay_start, stream_replay
from runtime.replay.report import ReplayReport, ordered
from runtime.replay.source import open_params
from runtime.rundir import RunDir

if TYPE_CHECKING:
    from ledger import EventStore

Log = Callable[[str], None]


def _quiet(message: str) -> None:
    del message


def replay_run(directory: str, *, run_id: str | None = None, from_version: int = 0, regenerate: bool = False,
               check_snapshots: bool = False, log: Log = _quiet, warn: Log = _quiet,
               progress: bool = False) -> ReplayReport:
    """Replay the run in ``directory`` (see the module docstring), streaming its events.

    Args:
      directory: the run directory (``ledger.db``, ``params/``).
      run_id: the run, when the ledger holds several.
      from_version: re-train from the newest version at or before this one that the run kept
        (``replay_start``; ``params.keep_every`` keeps checkpoints), loaded from the run's
        parameter store and checked against the ledger's digest; 0 rebuilds version 0.
      regenerate: also re-sample every rollout from a re-derived version.
      check_snapshots: also prove that every stored controller snapshot equals the fold of the
        log up to its seq.
      log: progress lines.
      warn: called once when the current fingerprint differs from the recorded one.
      progress: show the passes over the log, the warm start and the re-trained steps on stderr
        (``runtime.progress``).

    Raises:
      UsageError: bad directory, run or ``from_version``.
    """
    from ledger import open_store

    rundir = RunDir(directory)
    rundir.check_exists()
    with open_store(directory, readonly=True) as store:
        run_id = rundir.select_run(store, run_id)
        return _Replay(directory, store, run_id, log, warn, progress).run(from_version, regenerate, check_snapshots)


class _Replay:
    """One replay of one run, each stage a streaming pass over the store."""

    def __init__(self, directory: str, store, run_id: str, log: Log, warn: Log, progress: bool = False):
        self.directory, self.store, self.run_id, self.log, self.warn = directory, store, run_id, log, warn
        self.progress = progress
        self.t0 = time.monotonic()
        self.start = 0
        self.requested = 0
        self.steps_total = 0
        self.fp: dict = {}
        self.snapshots_checked = 0

    def events(self):
        return self.store.read(self.run_id)

    def report(self, divergences: list[Divergence], *, verified: int = 0, final: tuple[int, str] | None = None,
               regenerated: int = 0, rederived: int = 0, held: int = 0) -> ReplayReport:
        return ReplayReport(self.run_id, self.start, self.steps_total, verified, final and final[0],
                            final and final[1], regenerated, ordered(divergences), self.fp,
                            time.monotonic() - self.t0, self.requested, self.snapshots_checked, rederived, held)

    def _check_trainer_layouts(self, index) -> None:
        """Warn when this process cannot train with the bits the run's trainers had: another
        device count, or a gang of more than two devices (cross-process sums run in another order
        than in-process ones) without ``trainer.deterministic_reduction``."""
        import jax

        fixed = bool(index.run.config.get("trainer", {}).get("deterministic_reduction"))
        for layout in index.trainer_layouts:
            trained = f"{layout['devices']} devices in {layout['processes']} process(es)"
            if layout["devices"] != jax.device_count():
                self.warn(f"the run's trainer ran on {trained}; this replay has {jax.device_count()}: "
                          "bits may differ (on CPU, XLA_FLAGS=--xla_force_host_platform_device_count="
                          f"{layout['devices']} gives it as many)")
            elif layout["processes"] > 1 and layout["devices"] > 2 and not fixed:
                self.warn(f"the run's trainer was a gang ({trained}) and this replay trains in one process: "
                          "their sums over more than two devices run in other orders, so the last bits may differ "
                          "(trainer.deterministic_reduction makes them the same)")

    def run(self, from_version: int, regenerate: bool, check_snapshots: bool) -> ReplayReport:
        from ledger import LedgerError
        from runtime.controller import ReplayDivergence, snapshot
        from runtime.placement import HOST_COUNT_FLAG
        from runtime.session import fingerprint

        self.start = self.requested = from_version  # until the index says which kept version re-training starts from
        with Progress(f"verifying the hash chain of run {self.run_id!r}", None, unit="", tick=True,
                      enabled=self.progress):
            chain = self.store.verify(self.run_id)
        if not chain.ok:
            seq = chain.first_bad_seq or 0
            try:
                bad = next(iter(self.store.scan(self.run_id, seq, seq)), None)
            except LedgerError:  # an unreadable record: its kind is unknown too
                bad = None
            return self.report([Divergence("ledger", seq, "missing" if bad is None else bad.kind, "chain",
                                           f"hash chain: {chain.reason}")])
        with Progress("reading the log", chain.events, unit="events", enabled=self.progress) as bar:
            index = index_run(_Counter(bar).counted(self.events()))
        self.steps_total = len(index.steps)
        # Replay re-trains from logged outcomes and judges nothing: its stack is compared with the
        # trainer's (the host's in RunStarted, where no trainer joined: on its own devices it may run
        # on another platform), not the code sandbox or the run's device layout; the trainer's
        # device count and gang by what each trainer recorded (_check_trainer_layouts).
        def stack(fp: dict) -> dict:
            kept = {k: v for k, v in fp.items()
                    if k not in ("sandbox", "trainer", "layout", "devices", "processes", "collectives")}
            if isinstance(kept.get("xla_flags"), str):  # the host-device count is a device count
                kept["xla_flags"] = " ".join(f for f in kept["xla_flags"].split() if not f.startswith(HOST_COUNT_FLAG))
            return kept

        self.fp = fingerprint_diff(stack(index.trainer_fingerprint or index.run.fingerprint), stack(fingerprint()))
        # The run's input files, from where it recorded them, refused if they changed since.
        run_inputs.check(run_inputs.located(Config.from_dict(index.run.config), index.run.fingerprint),
                         index.run.fingerprint, what="replay", warn=self.warn)
        if self.fp:
            self.warn(f"the environment differs from the trainer's recorded one ({', '.join(self.fp)}): "
                      "bits may differ on another stack")
        last = index.steps[-1].step if index.steps else 0
        if type(from_version) is not int or not 0 <= from_version <= last or from_version not in index.versions:
            raise UsageError(f"--from-version {from_version!r} is not accepted; run {self.run_id!r} has versions 0..{last}")
        self.start = start = replay_start(index, from_version)
        if start != from_version:
            self.log(f"version {from_version} is not kept: re-training from version {start}, the nearest kept before it")

        url = RunDir(self.directory).logged_params(index.config_at(index.events + 1))  # a fork's own store
        pstore = open_params(url)
        divergences = _check_stored(index, pstore, url)
        self.log(f"folding {index.events} events of run {self.run_id!r} with decision checks"
                 + (", proving its snapshots" if check_snapshots else ""))
        try:
            # Snapshots are proven on a second scan of the log: only the fold alone has a known length.
            with Progress("folding the log", None if check_snapshots else chain.events, unit="events",
                          enabled=self.progress) as bar:
                counted = cast("EventStore", _CountedScans(self.store, bar))  # the store, its scans counted
                _, proofs = snapshot.prove(counted, self.run_id, snapshots=check_snapshots)
        except ReplayDivergence as e:
            divergences.append(Divergence("controller", e.seq, e.kind, e.field, str(e)))
            return self.report(divergences)
        rows = [p for p in proofs if not p.by]
        for proof in proofs:
            if proof.ok:
                self.snapshots_checked += not proof.by
            elif proof.by:
                divergences.append(Divergence("snapshot", proof.by, "snapshot", "digest",
                                              f"the snapshot at seq {proof.seq} is not the fold: {proof.reason}"))
            else:
                divergences.append(Divergence("snapshot", proof.seq, "snapshot", "state",
                                              f"the stored snapshot at seq {proof.seq} is not the fold: {proof.reason}"))
        if check_snapshots:
            self.log(f"{self.snapshots_checked} of {len(rows)} snapshots equal the fold at their seq; "
                     f"{sum(p.ok for p in proofs if p.by)} of {len(proofs) - len(rows)} body digests the log names "
                     "are the fold's")

        self._check_trainer_layouts(index)
        rerun = _Rerun(index, self.directory, pstore, self.log, sample=regenerate, progress=self.progress)
        if regenerate:
            for shape in index.engine_shapes:
                rebuilt = rerun.session.engine.batch_shape
                differs = sorted(k for k in set(shape) | set(rebuilt) if shape.get(k) != rebuilt.get(k))
                if differs:
                    self.warn(f"the rebuilt engine's batch shape differs from the run's ({', '.join(differs)}): "
                              "re-sampled bits may differ")
        divergences += rerun.start(start)
        steps = sum(step.step > start for step in index.steps)
        with Progress("replay", steps, enabled=self.progress and not rerun.stopped) as bar:
            if not rerun.stopped:
                for item in stream_replay(self.events(), index, start=start, sampled=regenerate):
                    if isinstance(item, StepPlan):
                        divergences += rerun.train(item)
                        if rerun.stopped:
                            break
                    else:
                        divergences += rerun.regenerate(item)
                    resampled = f", {rerun.regenerated:,} rollouts re-sampled" if regenerate else ""
                    bar.update(rerun.verified - (start == 0), f"{rerun.verified} versions match{resampled}")
        return self.report(divergences, verified=rerun.verified, final=rerun.final, regenerated=rerun.regenerated,
                           rederived=rerun.rederived, held=rerun.held_max)


class _Counter:
    """Counts what passes through :meth:`counted` on ``bar``, every ``every`` items and at the end
    of each pass; the count goes on across passes."""

    def __init__(self, bar: Progress, every: int = 4096):
        self.bar, self.every, self.n = bar, every, 0

    def counted(self, items):
        for item in items:
            self.n += 1
            if self.n % self.every == 0:
                self.bar.update(self.n)
            yield item
        self.bar.update(self.n)


class _CountedScans:
    """``store`` with every record its ``scan`` yields counted on ``bar`` (the fold reads the log
    through ``scan``); everything else is the store's own."""

    def __init__(self, store, bar: Progress):
        self._store, self._counter = store, _Counter(bar)

    def scan(self, *args, **kwargs):
        return self._counter.counted(self._store.scan(*args, **kwargs))

    def __getattr__(self, name: str):
        return getattr(self._store, name)


def recorded_engine_shapes(events) -> list[dict]:
    """The distinct engine batch shapes inference workers recorded when they joined."""
    return list(index_run(events).engine_shapes)


def _check_stored(plan: ReplayIndex, pstore, url: str) -> list[Divergence]:
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

    def __init__(self, plan: ReplayIndex, directory: str, pstore, log: Log, *, sample: bool, progress: bool = False):
        import tensorstore as ts

        from runtime.params import ParamStore
        from runtime.session import EngineShape, build_session, make_trainer
        from runtime.workers import EngineWorker

        self.plan, self.pstore, self.log = plan, pstore, log
        config = run_inputs.located(Config.from_dict(plan.run.config), plan.run.fingerprint)
        session = build_session(config, log=log, judge=False, engine=False, progress=progress)
        if sample:
            # The engine the run's inference workers recorded (the bits of a completion follow
            # from its shape), or, where they recorded none or several, the config's.
            shapes = plan.engine_shapes
            shape = EngineShape.recorded(shapes[0]) if len(shapes) == 1 else session.shape
            session = dataclasses.replace(session, shape=shape, engine=shape.build(session.model))
        self.session = session
        # A private context: the replay's versions never mix with any other memory:// store.
        self.store = ParamStore.open("memory://replay/", context=ts.Context())
        self.trainer = make_trainer(session, self.store, "replay-trainer", replay=True)
        # A fork's steps after its RunForked train with the fork's settings: one trainer per config.
        self._trainers = {plan.run.config_digest: self.trainer}
        self._last = self.trainer  # the trainer of the last step re-run
        self.sampler = None if not sample else EngineWorker(
            "replay-inference", session.engine, session.task, session.codec,
            lambda v: (self.store.get(v), self.store.digest(v)))
        # The versions each step's rows were sampled from, by step: what the replay's store must
        # still hold for the steps after one (``_release``).
        self._reads = {step.step: step.row_versions() for step in plan.steps}
        self._resampled: set[int] = set()  # versions whose completions were re-sampled
        self.held_max = 0  # the most versions the replay's store held at once
        self.verified = 0
        self.regenerated = 0
        self.rederived = 0  # multi-turn episodes re-derived from their recorded tool results
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
                for v in sorted(step.row_versions()):
                    if 0 < v < version and not step.could_not_read(v) and v not in self.store.versions():
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
        for v in self.store.versions():
            if step.could_not_read(v):
                self.store.delete(v)
        self._release()
        episodes = self._rederive(step)
        trained, published = self._trainer(step).train(step.task)
        self.held_max = max(self.held_max, len(self.store.versions()))
        self.final = (step.step, published.digest)
        found = episodes + compare_step(step, trained, published)
        differs = any(d.kind == published.KIND for d in found)
        self.stopped = differs
        self.verified += not differs
        if found:  # the steps that match are counted on the progress display
            self.log(f"step {step.step}: digest {published.digest[:16]} {'differs' if differs else 'matches'}"
                     f"{' (step metrics differ)' if not differs else ''}")
        return found

    def _release(self) -> None:
        """Drop from the replay's store every version it no longer needs: all but version 0 (the
        reference of every step), the newest (the next step trains from it), those the rows of a
        step after it were sampled from (their old log-probs) and, when re-sampling, those whose
        completions are still to be re-sampled. A replay then holds a few versions at a time, as
        the run did, not every version it re-derives (each with its optimizer state: three times
        the weights)."""
        if self.final is None:
            return
        newest = self.final[0]
        later = set().union(*(reads for step, reads in self._reads.items() if step > newest))
        for v in self.store.versions():
            if 0 < v < newest and v not in later and (self.sampler is None or v in self._resampled):
                self.store.delete(v)

    def _rederive(self, step: StepPlan) -> list[Divergence]:
        """Every multi-turn episode the step trains on, re-derived from its sampled ids with the
        recorded tool results (no tool runs): an appended id or a call that is not the record's
        is a divergence."""
        from runtime.episodes import EpisodeDivergence
        from runtime.episodes.rollout import rederive

        rollouts = [r for r in step.task.rollouts if r.completion.turns]
        if not rollouts:
            return []
        task, codec = self.session.task, self.session.codec
        env = task.environment(codec, tools={})  # no tool: every result comes from the record
        out = []
        for r in rollouts:
            problem = task.problem("train", r.request.prompt_index)
            c = r.completion
            try:
                rederive(env, problem, codec.encode_prompt(problem), c.tokens, c.logprobs, c.turns,
                         self.session.config.max_tokens)
            except EpisodeDivergence as e:
                out.append(Divergence("rollout", step.trained_seq, ev.RolloutCompleted.KIND, "turns",
                                      f"the episode re-derived from the recorded tool results differs: {e}",
                                      version=c.policy_version, rollout_id=c.rollout_id))
        self.rederived += len(rollouts) - len(out)
        return out

    def _trainer(self, step: StepPlan):
        """The trainer of the config ``step`` was trained with (a fork's, after its RunForked)."""
        fork = None
        for at, event in self.plan.forks:
            if at < step.trained_seq:
                fork = event
        digest = self.plan.run.config_digest if fork is None else fork.config_digest
        if digest not in self._trainers:
            from runtime.session import make_trainer, step_config

            assert fork is not None
            config = run_inputs.located(Config.from_dict(fork.config), {"inputs": fork.inputs})
            session = dataclasses.replace(self.session, config=config,
                                          step_config=step_config(config, self.session.model))
            trainer = make_trainer(session, self.store, "replay-trainer", replay=True)
            trainer.adopt(self._last)  # the fork's first step trains from the version at the fork
            self._trainers[digest] = trainer
        self._last = self._trainers[digest]
        return self._last

    def regenerate(self, batch: Sampled) -> list[Divergence]:
        """Re-sample every accepted rollout of a version and compare it with the logged one."""
        version, sampled = batch.version, batch.rollouts
        if not sampled:
            return []
        assert self.sampler is not None  # built when re-sampling
        got = {c.rollout_id: c for c in self.sampler.generate([r.lease for r in sampled])}
        self.regenerated += len(sampled)
        self._resampled.add(version)
        self._release()
        out = [d for r in sampled if (d := compare_rollout(r, got[r.lease.rollout_id])) is not None]
        if out:
            self.log(f"version {version}: re-sampled {len(sampled)} rollouts, {len(out)} differ")
        return out

