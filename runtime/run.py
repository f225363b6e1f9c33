"""``rlx run`` and ``rlx resume``: a whole run in this process's host, its workers started by a
runner, its summary written at the end.

The host (``runtime.host.Host``) holds the controller, the ledger's only writer, and its front;
the workers run the one worker loop (``runtime.host.worker``) either as ``rlx worker ROLE``
processes that this process supervises and serves over gRPC on loopback (``workers.mode =
"processes"``, the default; ``runtime.service.processes``) or as threads of this process
(``"threads"``; ``runtime.host.threads``). Either way they are admitted by the same front.
This module keeps the entry points, the pre-flight checks and the summary.

Everything that decides is in the ledger or a pure function of it, so the final weights depend on
(config, seed, data, software stack) only in deterministic mode — not on timing, on processes or
threads, on how many workers there are, or on how many of them were killed.
"""

from __future__ import annotations

import gc
import json
import os
import time
from collections.abc import Callable

from ledger import events as ev
from ledger import open_store
from runtime.config import PROCESSES, Config
from runtime.errors import UsageError
from runtime.host import Host, ThreadRunner
from runtime.placement import Layout
from runtime.rundir import RUN_LEDGER_FILE, RunDir, check_creatable, logged_run
from runtime.session import Session, build_session, build_task, resolve, run_fingerprint, trainer_mesh


def run(config: Config, out: str, *, progress: bool = True, log: Callable[[str], None] = print) -> dict:
    """Run ``config`` into directory ``out``; return the summary (also in ``out/summary.json``)."""
    from runtime.params import ParamStore

    rundir = RunDir(out)
    ledger_url = rundir.new_ledger(config.ledger.url)
    params_url = rundir.params(config.params.url)
    t_start = time.monotonic()
    _check_new_run(rundir, ledger_url, params_url, config.run.name)  # before anything is built or written
    _check_shareable(config, params_url)
    if config.log.tensorboard is not None:
        check_creatable(config.log.tensorboard, "log.tensorboard")
    # The data and the code sandbox are settled first: the sandbox's probes fork, which must not
    # happen while the workers' first calls are in flight in this process's gRPC threads.
    built = build_task(config, log=log)
    layout = _placement(config, log, new=True)  # before this process starts JAX: it may see only its own
    if config.workers.trainer_processes == 1 and layout.inherit:  # a gang's ranks count their devices together
        trainer_mesh(config)  # the trainer (a thread, or a process that inherits these devices) fits
    # Worker processes start now and build their roles while this process builds its own session.
    runner = _runner(config, out, layout=layout)
    try:
        # Resolved once, before anything is built from it: what RunStarted records is what runs.
        config = resolve(config, built[0])
        session = build_session(config, log=log, built=built, engine=_evaluates(config),  # validates model, data, task
                                progress=progress)
        os.makedirs(out, exist_ok=True)
        store = open_store(ledger_url, create=True, synchronous=config.ledger.synchronous)
    except BaseException:
        if runner is not None:
            runner.abandon()  # a run refused before it was recorded leaves nothing behind
        raise
    try:
        if config.ledger.url is not None:  # resume, replay and audit of `out` find the ledger through it
            rundir.point_to(ledger_url, config.run.name)
        pstore = ParamStore.open(params_url, create=True)
        host = Host.create(store, pstore, config, fingerprint=run_fingerprint(session, layout=layout), log=log)
        return _drive(session, host, out, runner, t_start, progress, log, layout)
    finally:
        if runner is not None:
            runner.stop()  # when the run did not get as far as running them
        store.close()


def _runner(config: Config, out: str, session: Session | None = None, *, layout: Layout):
    """The runner of ``workers.mode``: worker processes on the devices of ``layout`` (started
    now) or threads (started when the host is attached; they need ``session``, None until it is
    built)."""
    if config.workers.mode == PROCESSES:
        from runtime.service.processes import ProcessRunner

        return ProcessRunner(config, out, layout)
    return None if session is None else ThreadRunner(session)


def _evaluates(config: Config) -> bool:
    """Whether this process needs an engine: it evaluates versions, or lends its engine to the
    first inference worker thread."""
    return config.workers.mode != PROCESSES or config.eval.every_steps > 0


def _placement(config: Config, log: Callable[[str], None], *, new: bool) -> Layout:
    """The layout of the run's processes on this host (``runtime.placement``; a new run's unset
    ``workers.devices`` is ``"auto"``, a logged run's reads as ``"inherit"``), applied to this
    process (the host, which evaluates) when its JAX backend has not started yet. A layout that
    cannot be is a one-line error before anything starts."""
    from runtime import placement

    layout = placement.for_run(config, new=new)
    placement.apply_to_this_process(layout)  # an inherited layout: on a GPU, the deterministic flags only
    if not layout.inherit:
        log(layout.describe())
    return layout


def _check_new_run(rundir: RunDir, ledger_url: str, params_url: str, run_name: str) -> None:
    """Refuse, before anything is built or written, a run that could not be recorded: an output
    path that cannot be a directory, a ledger that is not one or cannot be reached, a run name
    the ledger already holds, a parameter store URL that cannot name a store."""
    from ledger.url import resolve_url
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
                raise UsageError(_existing_run(rundir, existing.url, run_name))
    location = parse_location(params_url)
    if location.directory is not None and os.path.exists(location.directory) and not os.path.isdir(location.directory):
        raise UsageError(f"the parameter store {params_url!r} is not a directory")


def _existing_run(rundir: RunDir, url: str, run_name: str) -> str:
    """What to say when the ledger at ``url`` already holds ``run_name``: resume it where ``--out``
    is that run's directory, else pick another name (a server's ledger holds many runs, and the
    directory of the one that took the name may be anywhere)."""
    holder = os.path.isfile(os.path.join(rundir.path, RUN_LEDGER_FILE)) or rundir.pointed_run == run_name
    if holder:
        return (f"run {run_name!r} already exists in {url}; continue it with `rlx resume {rundir.path}`, "
                "or choose another --out")
    return (f"run {run_name!r} already exists in {url}; give this run another name (--set run.name=NAME), "
            "or continue that run with `rlx resume` on the run directory whose ledger.json names it")


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
    from runtime import inputs as run_inputs
    from runtime.controller import snapshot
    from runtime.params import ParamStore
    from runtime.replay.divergence import fingerprint_diff

    t_start = time.monotonic()
    rundir = RunDir(out)
    with open_store(rundir.ledger, readonly=True) as reader:
        run_id = rundir.select_run(reader, run_id)
        first = logged_run(reader, run_id)  # a fork runs with its newest RunForked's settings
    # Built from the input files the run recorded, by absolute path, and only while they hold
    # what the run read (the logged config, and its digest, stay as they are).
    config = run_inputs.located(Config.from_dict(first.config), first.fingerprint)
    current_inputs = run_inputs.check(config, first.fingerprint, what="resume", warn=log)
    store = open_store(rundir.ledger, synchronous=config.ledger.synchronous)
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
        layout = _placement(config, log, new=False)
        session = build_session(config, log=log, engine=_evaluates(config), progress=progress)
        swept = pstore.sweep()
        if swept:
            log(f"removed {len(swept)} half-written parameter version(s) left by the crash")
        missing = [v for v in sorted(state.versions) if v not in pstore.versions()]
        if state.latest >= 0 and state.latest in missing:
            raise UsageError(
                f"version {state.latest} is in the ledger but missing from the parameter store {params_url}; "
                "`rlx replay` re-derives it"
            )
        here = run_fingerprint(session, current_inputs, layout=layout)
        changed = fingerprint_diff(first.fingerprint, here)
        if changed:
            what = ", ".join(f"{k} {v['recorded']!r} → {v['current']!r}" for k, v in changed.items())
            log(f"warning: this machine differs from the one recorded in RunStarted ({what}): the steps "
                "trained from here are valid, but their bits may differ from an uninterrupted run's")
        host = Host.resume(store, pstore, run_id, fingerprint=here, log=log, start=recovered)
        ctrl = host.ctrl
        since = f"snapshot at seq {recovered.snapshot_seq}" if recovered.snapshot_seq else "seq 1"
        log(f"resumed run {run_id!r} at step {ctrl.state.trained} of {config.run.steps} "
            f"(writer epoch {ctrl.epoch}, ledger head seq {ctrl.head_seq}, folded from {since})")
        return _drive(session, host, out, None, t_start, progress, log, layout)
    finally:
        store.close()


def _drive(session: Session, host: Host, out: str, runner, t_start: float, progress: bool,
           log: Callable[[str], None], layout: Layout) -> dict:
    """Run the workers (``runner``, started already, or the one of ``workers.mode``, started now)
    until the run finishes, with the host's observers listening; wait for the last due
    evaluation; write summary.json and report.png. The RL time counts from here: from when the
    controller is ready to when the run finished."""
    config = session.config
    if runner is None:
        runner = _runner(config, out, session, layout=layout)
    # Processes mode leaves this process's engine idle during the run; threads mode lends it to the
    # first inference worker, so the evaluator gets one of the same shape.
    host.observe(engine=session.engine if config.workers.mode == PROCESSES else session.new_engine(),
                 task=session.task, codec=session.codec)
    # Everything built so far (model, compiled programs, the folded state) lives for the whole
    # run: keep it out of the cyclic collector's passes until the run ends. The controller and
    # the workers allocate many short-lived, acyclic objects (events, leases, tuples): collect the
    # young generation 20,000 allocations apart instead of 700, which cut the time every thread
    # spends in the collector by about 5x in `scripts/bench_e2e.py`.
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], 20_000), *thresholds[1:])
    t_rl = time.monotonic()
    trained_before = host.ctrl.state.trained
    finished = False
    try:
        try:
            runner.attach(host)
            host.watch(progress=progress, stopped=runner.stopped, tick=runner.tick, beat=runner.beat)
        finally:
            runner.join()
        finished = host.ctrl.finished
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
        rl_seconds = time.monotonic() - t_rl
        host.close(finished=finished)
    ctrl = host.ctrl
    summary = _summary(ctrl.store, config, ctrl.state.config_digest, rl_seconds, time.monotonic() - t_start,
                       ctrl.completed_tokens, session.warm_start, ctrl.state.trained - trained_before)
    if summary["eval_before"] is not None and summary["eval_after"] is not None:
        log(f"held-out pass rate: {summary['eval_before']:.1%} before RL (version 0), {summary['eval_after']:.1%} "
            f"after (version {summary['final_version']}, {summary['eval_size']} problems, greedy)")
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
    from runtime.report import plot_report

    plot_report(summary, os.path.join(out, "report.png"))
    return summary


def _summary(store, config: Config, config_digest: str, rl_seconds: float, total_seconds: float, tokens: int,
             warm_start: dict, steps_here: int) -> dict:
    """The run's summary, read from its ledger: the held-out pass rates before (version 0) and
    after (the final version) are those versions' ``VersionEvaluated`` (None where the run
    evaluated nothing, ``eval.every_steps = 0``); ``steps_per_minute`` counts the ``steps_here``
    this process trained in its ``rl_seconds`` (after a resume, the steps since the resume);
    ``logprob_mismatch_max_run`` is the largest ``logprob_mismatch_max`` of any step."""
    steps, rollouts, evaluations = [], 0, []
    started, machine = None, None
    published: dict[int, str] = {}
    for s in store.read(config.run.name):
        e = s.event
        if isinstance(e, ev.TrainStepCompleted):
            steps.append({"step": e.step, **e.metrics})
        elif isinstance(e, ev.WeightsPublished):
            published[e.version] = e.digest
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
            machine = f"{e.fingerprint.get('cpu', '?')}, {e.fingerprint.get('cores', '?')} cores"
    steps.sort(key=lambda m: m["step"])
    evaluations.sort(key=lambda m: m["version"])
    final_version = max(published, default=-1)
    by_version = {m["version"]: m for m in evaluations}
    before, after = by_version.get(0), by_version.get(final_version)
    return {
        "run": config.run.name,
        "config_digest": config_digest,
        "final_version": final_version,
        "final_digest": published.get(final_version, ""),
        "steps": len(steps),
        "eval_before": None if before is None else before["greedy_pass_rate"],
        "eval_after": None if after is None else after["greedy_pass_rate"],
        "eval_size": None if after is None else after["problems"],
        "warm_start": warm_start,
        "rollouts": rollouts,
        "rollout_tokens": tokens,
        "rl_seconds": rl_seconds,
        "total_seconds": total_seconds,
        "steps_per_minute": 60.0 * steps_here / max(rl_seconds, 1e-9),
        "steps_here": steps_here,
        "machine": machine,
        "rollout_tokens_per_s": tokens / max(rl_seconds, 1e-9),
        # The largest inference/trainer log-prob gap of any step (0.0 with trainer.exact_logprobs).
        "logprob_mismatch_max_run": max((m["logprob_mismatch_max"] for m in steps if "logprob_mismatch_max" in m),
                                        default=None),
        "reward_curve": [m.get("reward_mean") for m in steps],
        "pass_rate_curve": [m.get("pass_rate") for m in steps],
        "metrics": steps,
        "evaluations": evaluations,
    }


__all__ = ["resume", "run"]
