"""Resume and replay at scale: the time ``rlx resume`` takes to its first new decision, and the
memory ``rlx replay`` holds, on run ledgers of about 100k and 2M events.

The ledgers are synthetic but shaped like real runs: the demo's scheduling (deterministic mode,
max_staleness 1, groups of 8, up to 8 completion tokens; batches of 128 groups), hence its event mix,
driven through the real controller and a real SQLite ledger with the default snapshot interval
(``ledger.snapshot_every``); completions are random tokens and rewards a hash (mixed within
groups), but every train step is a real one (``StepTrainer`` of a very small model, real weights
in a file:// parameter store), so ``rlx replay`` re-trains every step of the run and must
reproduce every digest. The run is left unfinished, as a crash leaves it.

Measured, for each ledger:
- ``resume_s``: from starting ``rlx resume DIR`` (a fresh process) to the first decision event
  its controller appends, read from the ledger by this process; then the resume is killed
  (-9) and the next repeat resumes again. Median of ``--repeats``, small and large alternating.
- ``replay_peak_mib``: the peak resident memory of ``rlx replay DIR --json`` (the whole
  re-derivation; ``wait4``'s ``ru_maxrss`` of that process), which must match bit for bit; the
  first replay on a machine, which also compiles the model's programs, is reported apart.

Targets (issue 19): ``resume_s_large`` ≤ 1.5 × ``resume_s_small``; ``replay_peak_mib`` of the
large ledger ≤ 1,024.

Usage: ``python scripts/bench_resume.py [--small 100000] [--large 2000000] [--repeats 3]
[--dir DIR]``; the last line printed is a JSON object. Generating the large ledger takes a few
minutes on 2 cores; ``--dir`` keeps the ledgers for another invocation.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from ledger import events as ev  # noqa: E402
from ledger import open_store  # noqa: E402
from runtime.config import Config  # noqa: E402
from runtime.rundir import RunDir  # noqa: E402

OVERRIDES = {
    "run": {"name": "run", "steps": 1_000_000, "seed": 0},
    "model": {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 32},
    "pretrain": {"steps": 0},
    "scheduling": {"groups_per_batch": 128},
    "workers": {"mode": "threads", "inference_slots": 1024},
    "ledger": {"synchronous": "NORMAL"},
}
"""The demo's run (default sampling and scheduling: groups of 8, deterministic, max_staleness 1) with
batches of 128 groups instead of 32 (so that 2M events are ~900 real train steps, not ~3,500),
a very small model and no warm start."""

WORKER = "inference-0"


def _hash(*parts: object) -> bytes:
    return hashlib.sha256(repr(parts).encode()).digest()


def _completion(lease, vocab: int, max_tokens: int) -> ev.RolloutCompleted:
    g = np.random.Generator(np.random.Philox(key=np.frombuffer(_hash(lease.rollout_id, lease.seed), np.uint64)[:2]))
    n = int(g.integers(1, max_tokens + 1))
    tokens = g.integers(4, vocab, size=n, dtype=np.int32)
    logprobs = -g.random(n, dtype=np.float32) * 4
    return ev.RolloutCompleted(lease.rollout_id, WORKER, lease.attempt, lease.policy_version, lease.weights_digest,
                               tokens, logprobs, "length" if n == max_tokens else "stop")


def _outcome(task) -> ev.OutcomeRecorded:
    passed = _hash(task.rollout_id)[0] % 3 == 0
    return ev.OutcomeRecorded(task.rollout_id, float(passed), passed, "AC" if passed else "WA", "synthetic", "1")


def synthesize(out: str, events: int, log) -> dict:
    """A run directory ``out`` whose ledger holds about ``events`` events (see the module docstring),
    hosted and trained as ``rlx run`` hosts and trains a run (``runtime.host.Host``,
    ``runtime.session.make_trainer``), with synthetic inference and verifier workers."""
    from runtime.controller.workers import TrainTask
    from runtime.host import Host
    from runtime.host.roles import TrainerRole
    from runtime.host.threads import ThreadPort
    from runtime.params import ParamStore
    from runtime.session import build_session, build_task, make_trainer, resolve, run_fingerprint

    config = Config.from_dict(OVERRIDES)
    built = build_task(config, log=lambda m: None)
    config = resolve(config, built[0])
    session = build_session(config, log=lambda m: None, built=built)
    os.makedirs(out)
    store = open_store(os.path.join(out, "ledger.db"), create=True, synchronous=config.ledger.synchronous)
    pstore = ParamStore.open(f"file://{os.path.abspath(out)}/params", create=True)
    host = Host.create(store, pstore, config, fingerprint=run_fingerprint(session), log=log)
    port = ThreadPort(host.front)
    trainer = TrainerRole(make_trainer(session, pstore, "trainer-0"))
    vocab, max_tokens = session.model.config.vocab_size, config.max_tokens
    port.join(WORKER, "inference", slots=config.workers.inference_slots)
    port.join("verifier-0", "verifier")
    port.join("trainer-0", "trainer", info=trainer.info)
    t0, steps = time.monotonic(), 0
    try:
        while host.ctrl.head_seq < events:
            work = port.poll("trainer-0", wait_s=0)
            if work.train is not None:
                port.submit("trainer-0", trainer.run(work.train))
                host.retirer.sweep()
                if not isinstance(work.train, TrainTask):
                    continue
                steps += 1
                if steps % 200 == 0:
                    log(f"  {out}: step {steps}, {host.ctrl.head_seq:,} events, {time.monotonic() - t0:.0f} s")
                continue
            leases = port.poll(WORKER, wait_s=0).leases
            if leases:
                port.submit(WORKER, [_completion(lease, vocab, max_tokens) for lease in leases])
            scoring = port.poll("verifier-0", max_items=1 << 16, wait_s=0).scores
            if scoring:
                port.submit("verifier-0", [_outcome(t) for t in scoring])
            if not leases and not scoring:
                raise RuntimeError(f"the synthetic run stalled at seq {host.ctrl.head_seq}")
        head = host.ctrl.head_seq
    finally:
        store.close()
    return {"events": head, "steps": steps, "seconds": time.monotonic() - t0}


def _rlx(*args: str) -> list[str]:
    return [sys.executable, "-m", "runtime.cli", *args]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}


def resume_once(out: str, timeout_s: float = 300.0) -> float:
    """Seconds from starting ``rlx resume out`` to the first decision its controller appends."""
    from runtime.controller import DECISION_KINDS

    kinds = {k.__name__ for k in DECISION_KINDS}
    with open_store(RunDir(out).ledger, readonly=True) as reader:
        before = reader.head("run").seq
        epoch = max(r.epoch for r in reader.scan("run", before, before))
    t0 = time.monotonic()
    proc = subprocess.Popen(_rlx("resume", out), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        with open_store(RunDir(out).ledger, readonly=True) as reader:
            seen = before
            while time.monotonic() - t0 < timeout_s:
                for r in reader.scan("run", seen + 1):
                    seen = r.seq
                    if r.epoch > epoch and r.kind in kinds:
                        return time.monotonic() - t0
                if proc.poll() is not None:
                    _, err = proc.communicate()
                    raise RuntimeError(f"rlx resume exited {proc.returncode}: {err.decode()[-2000:]}")
                time.sleep(0.01)
        raise RuntimeError(f"rlx resume made no decision within {timeout_s} s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def replay_peak(out: str) -> tuple[float, dict]:
    """(peak resident MiB, report) of ``rlx replay out --json``."""
    proc = subprocess.Popen(_rlx("replay", out, "--json"), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout = proc.stdout.read()  # type: ignore[union-attr]
    stderr = proc.stderr.read()  # type: ignore[union-attr]
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = stdout.decode().strip().splitlines()
    if not lines:
        raise RuntimeError(f"rlx replay exited {proc.returncode}: {stderr.decode()[-2000:]}")
    return usage.ru_maxrss / 1024, json.loads(lines[-1])


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", type=int, default=100_000, help="events in the small ledger")
    p.add_argument("--large", type=int, default=2_000_000, help="events in the large ledger")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", help="keep (or reuse) the synthetic runs here")
    args = p.parse_args(argv)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    base = args.dir or tempfile.mkdtemp(prefix="rlx-bench-resume-")
    made: dict[str, dict] = {}
    runs = {"small": os.path.join(base, f"small-{args.small}"), "large": os.path.join(base, f"large-{args.large}")}
    try:
        for name, n in (("small", args.small), ("large", args.large)):
            if not os.path.isdir(runs[name]):
                log(f"synthesizing the {name} run ({n:,} events)")
                made[name] = synthesize(runs[name], n, log)
                log(f"  {made[name]['events']:,} events, {made[name]['steps']} steps in {made[name]['seconds']:.0f} s")
        # Replay first, on the ledgers as synthesized (a resume adds a few events and kills mid-step).
        # The first replay on a machine compiles the model's programs, whose transient memory sets
        # its peak; it is reported apart (``replay_peak_mib_first``), then each run is measured with
        # the programs in the persistent compilation cache, as any later replay finds them.
        log("replaying the small run once to fill the compilation cache")
        first, _ = replay_peak(runs["small"])
        peaks = {}
        for name in ("small", "large"):
            log(f"replaying the {name} run")
            mib, report = replay_peak(runs[name])
            if not report.get("match"):
                raise RuntimeError(f"the replay of the {name} run diverges: {report.get('first_divergence')}")
            peaks[name] = (mib, report)
            log(f"  bit-exact, {report['versions_verified']} versions, peak {mib:.0f} MiB, {report['seconds']:.0f} s")
        times: dict[str, list[float]] = {"small": [], "large": []}
        for i in range(args.repeats):
            for name in ("small", "large"):
                times[name].append(resume_once(runs[name]))
                log(f"  resume {i + 1} of the {name} run: first decision after {times[name][-1]:.2f} s")
        with open_store(RunDir(runs["large"]).ledger, readonly=True) as reader:
            snaps = reader.snapshots("run")
            large_events = reader.head("run").seq
        small_s, large_s = statistics.median(times["small"]), statistics.median(times["large"])
        return {
            "small_events": made.get("small", {}).get("events"),
            "large_events": large_events,
            "large_steps": peaks["large"][1]["steps_total"],
            "snapshot_seq_large": snaps[0].seq if snaps else 0,
            "resume_s_small": round(small_s, 3),
            "resume_s_large": round(large_s, 3),
            "resume_ratio": round(large_s / small_s, 3),
            "resume_s_small_all": [round(t, 3) for t in times["small"]],
            "resume_s_large_all": [round(t, 3) for t in times["large"]],
            "replay_peak_mib": round(peaks["large"][0], 1),
            "replay_peak_mib_small": round(peaks["small"][0], 1),
            "replay_peak_mib_first": round(first, 1),
            "replay_s_large": round(peaks["large"][1]["seconds"], 1),
            "generate_s": {k: round(v["seconds"], 1) for k, v in made.items()},
        }
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
