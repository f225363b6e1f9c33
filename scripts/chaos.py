#!/usr/bin/env python
"""Chaos test of ``rlx run``: SIGKILL its worker processes at random moments and check that the
run ends exactly where an uninterrupted one does, with nothing lost or counted twice.

1. A small deterministic ``rlx run`` in processes mode (a tiny model on two-digit sums) runs in
   a subprocess while this script kills its ``rlx worker`` children of every role (inference,
   verifier, trainer) with SIGKILL, ``--kills`` times. The live pids come from the run's
   ``workers.jsonl`` (the latest ``spawn`` of each slot with no later ``exit``) and are checked
   against ``/proc/PID/cmdline`` before each kill. A role is killed a random moment after a
   child of it delivered work (its ``first_accept`` line), so again only after the replacement
   of its last victim did; the time from the kill to that line is the role's recovery time.
   Which role and when come from a seeded ``random.Random`` (``--seed``): this is a test
   harness, nothing of the run decides on it. Every process keeps its compiled XLA programs in a
   persistent cache (``--no-compile-cache``: not), so a replacement loads instead of compiling.
2. The same config runs uninterrupted in processes mode and in threads mode; the three final
   digests (``summary.json``) must be equal.
3. The killed run must pass ``rlx audit DIR check`` and ``rlx ledger verify DIR``, and its ledger
   must hold every acknowledged event once: each rollout of a ``BatchFormed`` has exactly one
   ``RolloutCompleted`` and one ``OutcomeRecorded``, no rollout has two of either, and every step
   1..N has one ``TrainStepCompleted`` and every version 0..N one ``WeightsPublished``
   (``lost_events`` counts the violations).
4. With ``--postgres URL`` (default: ``$RLX_TEST_POSTGRES_URL`` if set, else skipped), an
   ``rlx controller`` on a PostgreSQL ledger serves separate ``rlx worker`` processes; the
   controller is SIGKILLed ``--controller-kills`` times and restarted on the same port (role
   ``controller``; its recovery ends at the first worker submission the new controller appends),
   and its final digest joins the comparison. Its ledger tables go into a new schema of that
   database, dropped at the end unless kept.

Usage: python scripts/chaos.py [--steps 40] [--kills 20] [--seed 0] [--postgres URL] [--keep]
The last line of output is a JSON object: ``kills`` (by role), ``digest_match``, ``audit_ok``,
``lost_events``, ``recovery_s`` (per role: median and max), the digests and the timings.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

ROLES = ("inference", "verifier", "trainer")
CONTROLLER = "controller"
RUN_TIMEOUT_S = 900.0
SUBMISSIONS = ("RolloutCompleted", "OutcomeRecorded", "TrainStepCompleted", "WeightsPublished")


# --- the run ---------------------------------------------------------------------------------

def tiny_config(data: str, cache_dir: str, *, steps: int, seed: int) -> dict:
    """A tiny model on two-digit sums: a few seconds per step, groups with mixed rewards."""
    return {
        "run": {"steps": steps, "seed": seed},
        "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64},
        "pretrain": {"steps": 200, "batch_size": 32, "cache_dir": cache_dir},
        "eval": {"size": 4},
        "data": {"task": "jsonl", "path": data, "eval_fraction": 0.2},
        "sampling": {"group_size": 4, "max_tokens": 4},
        "scheduling": {"groups_per_batch": 2, "max_staleness": 1},
        "trainer": {"learning_rate": 1e-2},
        "workers": {"inference_slots": 8},
        "params": {"keep_newest": 1},
    }


def write_toml(path: str, config: dict) -> None:
    """``config`` (sections of scalars) as TOML; JSON's scalars are TOML's."""
    with open(path, "w", encoding="utf-8") as f:
        for section, fields in config.items():
            f.write(f"[{section}]\n")
            f.writelines(f"{key} = {json.dumps(value)}\n" for key, value in fields.items())
            f.write("\n")


def prepare(workdir: str, *, steps: int, seed: int, cache_dir: str | None = None) -> str:
    """Write the data and the config into ``workdir``; return the config's path."""
    os.makedirs(workdir, exist_ok=True)
    data = os.path.join(workdir, "sums.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                     for a in range(5) for b in range(5))
    path = os.path.join(workdir, "config.toml")
    write_toml(path, tiny_config(data, cache_dir or os.path.join(workdir, "warm_start"), steps=steps, seed=seed))
    return path


def rlx(*args: str) -> list[str]:
    return [sys.executable, "-m", "runtime.cli", *args]


COMPILE_CACHE = True


def child_env() -> dict[str, str]:
    """This checkout first on the path of ``rlx`` and of the workers it starts; with
    ``COMPILE_CACHE`` every compiled XLA program kept in a persistent cache (``$JAX_COMPILATION_CACHE_DIR``,
    default ``.jax_cache`` of the checkout, as the tests and ``bench_e2e.py`` do), so a replacement
    worker loads its programs instead of compiling them again."""
    from runtime import compile_cache

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    if COMPILE_CACHE:
        env.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(REPO, ".jax_cache"))
        # bounded as rlx bounds it (the test suite shares the directory; see tests/conftest.py)
        env.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(compile_cache.MAX_BYTES))
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    else:
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
    return env


def sets(overrides: Sequence[str]) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def start_run(config: str, out: str, *, mode: str = "processes", overrides: Sequence[str] = ()) -> subprocess.Popen:
    """``rlx run`` in its own process group (killed whole on a timeout); output in ``OUT.log``."""
    argv = rlx("run", config, "--out", out, "--no-progress", *sets([f'workers.mode="{mode}"', *overrides]))
    with open(out + ".log", "wb") as log:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=child_env(), start_new_session=True)


def finish(proc: subprocess.Popen, out: str, deadline: float) -> dict:
    """Wait for the run until ``deadline`` (then kill it: a hang); return its summary."""
    try:
        proc.wait(max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise RuntimeError(f"rlx run {out} did not finish in time (a hang?); its output: {out}.log") from None
    if proc.returncode != 0:
        raise RuntimeError(f"rlx run {out} exited with {proc.returncode}: {log_tail(out + '.log')}")
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        return json.load(f)


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def log_tail(path: str, lines: int = 5) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return " | ".join(line.strip() for line in f.read().splitlines()[-lines:])
    except OSError:
        return "(no output)"


def run_plain(config: str, out: str, *, mode: str = "processes", overrides: Sequence[str] = (),
              timeout_s: float = RUN_TIMEOUT_S) -> dict:
    """An uninterrupted run; its summary."""
    return finish(start_run(config, out, mode=mode, overrides=overrides), out, time.monotonic() + timeout_s)


# --- killing workers -------------------------------------------------------------------------

@dataclasses.dataclass
class Worker:
    slot: str
    role: str
    worker_id: str
    pid: int


@dataclasses.dataclass
class Kill:
    """One SIGKILL: whom, when (wall time), and when its replacement first delivered."""

    role: str
    slot: str
    worker_id: str
    pid: int
    t: float
    recovered_t: float | None = None
    replacement: str | None = None

    @property
    def recovery_s(self) -> float | None:
        return None if self.recovered_t is None else self.recovered_t - self.t


def read_journal(run_dir: str) -> list[dict]:
    """The lines of ``workers.jsonl`` written so far (a half-written last line is skipped)."""
    entries = []
    try:
        with open(os.path.join(run_dir, "workers.jsonl"), encoding="utf-8") as f:
            for line in f:
                try:
                    entries.append(json.loads(line))
                except json.JSONDecodeError:
                    break
    except FileNotFoundError:
        pass
    return entries


def live_workers(entries: Sequence[dict]) -> dict[str, Worker]:
    """Slot → its child: the latest spawn of each slot with no later exit."""
    live: dict[str, Worker] = {}
    for e in entries:
        if e["event"] == "spawn":
            live[e["slot"]] = Worker(e["slot"], e["role"], e["worker_id"], e["pid"])
        elif e["event"] == "exit" and e["slot"] in live and live[e["slot"]].worker_id == e["worker_id"]:
            del live[e["slot"]]
    return live


def runs_as(pid: int, role: str) -> bool:
    """Whether process ``pid`` is an ``rlx worker ROLE`` (not a reused pid)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return f"worker {role}" in " ".join(a.decode(errors="replace") for a in argv)


def recovered(kill: Kill, entries: Sequence[dict]) -> bool:
    """Note the first accepted submission of a later child of the killed worker's slot."""
    for e in entries:
        if (e["event"] == "first_accept" and e["slot"] == kill.slot and e["t"] >= kill.t
                and e["worker_id"].split("~")[0] != kill.worker_id):
            kill.recovered_t, kill.replacement = e["t"], e["worker_id"]
            return True
    return False


def kill_workers(proc: subprocess.Popen, run_dir: str, *, kills: int, rng: random.Random,
                 roles: Sequence[str] = ROLES, max_gap_s: float = 2.0, deadline: float | None = None,
                 log=print) -> list[Kill]:
    """SIGKILL ``kills`` worker processes of the run ``proc`` writes into ``run_dir``, then wait
    (while the run lasts) for the last victims' replacements to deliver.

    A role can be killed once a live child of it has delivered work (the replacement of its last
    victim, at first the child the run started with), after a further ``uniform(0, max_gap_s)``
    seconds of its own: victims die while working or while waiting for work. When several roles
    are due, one is drawn, the less often killed ones more likely (``1 / (1 + kills)²``), and one
    of its children that delivered.
    """
    done: list[Kill] = []
    pending: dict[str, Kill] = {}
    due: dict[str, float] = {}
    count: Counter[str] = Counter()
    deadline = deadline if deadline is not None else time.monotonic() + RUN_TIMEOUT_S
    while proc.poll() is None and (len(done) < kills or pending) and time.monotonic() < deadline:
        time.sleep(0.05)
        entries = read_journal(run_dir)
        now = time.time()
        for role, k in list(pending.items()):
            if recovered(k, entries):
                del pending[role]
                log(f"  {k.role} {k.worker_id} replaced by {k.replacement}: delivered {k.recovery_s:.1f} s after the kill")
        live = live_workers(entries)
        delivered = {e["worker_id"].split("~")[0] for e in entries if e["event"] == "first_accept"}
        working = [w for w in live.values() if w.worker_id in delivered]
        for role in roles:
            if role not in pending and role not in due and any(w.role == role for w in working):
                due[role] = now + rng.uniform(0.0, max_gap_s)
        if len(done) >= kills:
            continue
        ready = sorted(r for r, t in due.items() if t <= now)
        if not ready:
            continue
        role = rng.choices(ready, weights=[1.0 / (1 + count[r]) ** 2 for r in ready])[0]
        victims = sorted((w for w in working if w.role == role), key=lambda w: w.slot)
        victim = rng.choice(victims) if victims else None
        if victim is None or not runs_as(victim.pid, role):  # exited a moment ago; the journal will say so
            due.pop(role)
            continue
        try:
            os.kill(victim.pid, signal.SIGKILL)
        except ProcessLookupError:
            due.pop(role)
            continue
        k = Kill(role, victim.slot, victim.worker_id, victim.pid, time.time())
        done.append(k)
        pending[role] = k
        due.pop(role)
        count[role] += 1
        log(f"kill {len(done)}/{kills}: {role} {victim.worker_id} (pid {victim.pid})")
    return done


def run_with_kills(config: str, out: str, *, kills: int, seed: int, overrides: Sequence[str] = (),
                   max_gap_s: float = 2.0, timeout_s: float = RUN_TIMEOUT_S, log=print) -> tuple[dict, list[Kill]]:
    """A processes-mode run whose workers are SIGKILLed ``kills`` times; (summary, kills)."""
    deadline = time.monotonic() + timeout_s
    proc = start_run(config, out, overrides=overrides)
    try:
        done = kill_workers(proc, out, kills=kills, rng=random.Random(seed), max_gap_s=max_gap_s,
                            deadline=deadline, log=log)
        summary = finish(proc, out, deadline)
    finally:
        if proc.poll() is None:
            kill_group(proc)
    for k in done:  # a replacement may have delivered after the loop stopped looking
        if k.recovered_t is None:
            recovered(k, read_journal(out))
    return summary, done


# --- checks ----------------------------------------------------------------------------------

def ledger_violations(target: str, run_id: str | None = None) -> list[str]:
    """Acknowledged events lost or counted twice in the run's ledger (empty: none)."""
    from ledger import events as ev
    from ledger import open_store
    from runtime.rundir import RunDir

    with open_store(RunDir(target).ledger if os.path.isdir(target) else target, readonly=True) as store:
        if run_id is None:
            run_id = RunDir(target).select_run(store)
        events = [s.event for s in store.read(run_id)]
    completed: Counter[int] = Counter()
    scored: Counter[int] = Counter()
    trained: Counter[int] = Counter()
    published: Counter[int] = Counter()
    batched: list[tuple[int, int]] = []
    steps = None
    finished = 0
    for e in events:
        if isinstance(e, ev.RunStarted):
            steps = int(e.config["run"]["steps"])
        elif isinstance(e, ev.RolloutCompleted):
            completed[e.rollout_id] += 1
        elif isinstance(e, ev.OutcomeRecorded):
            scored[e.rollout_id] += 1
            if completed[e.rollout_id] == 0:
                # A verifier scored something the ledger never acknowledged as completed.
                scored[e.rollout_id] += 1000
        elif isinstance(e, ev.BatchFormed):
            batched.extend((e.step, r) for r in e.rollout_ids)
        elif isinstance(e, ev.TrainStepCompleted):
            trained[e.step] += 1
        elif isinstance(e, ev.WeightsPublished):
            published[e.version] += 1
        elif isinstance(e, ev.RunFinished):
            finished += 1
    bad = [f"rollout {r} completed {n} times" for r, n in sorted(completed.items()) if n > 1]
    bad += [f"rollout {r} scored {n} times" + (" (before any completion)" if n >= 1000 else "")
            for r, n in sorted(scored.items()) if n > 1]
    bad += [f"rollout {r} of step {s}'s batch has {completed[r]} completions and {scored[r]} outcomes"
            for s, r in batched if completed[r] != 1 or scored[r] != 1]
    bad += [f"rollout {r} is in {n} batches" for r, n in sorted(Counter(r for _, r in batched).items()) if n > 1]
    if steps is None:
        bad.append("no RunStarted")
    else:
        bad += [f"step {s}: {trained[s]} TrainStepCompleted" for s in range(1, steps + 1) if trained[s] != 1]
        bad += [f"version {v}: {published[v]} WeightsPublished" for v in range(steps + 1) if published[v] != 1]
        bad += [f"step {s} trained past run.steps" for s in trained if not 1 <= s <= steps]
    if finished != 1:
        bad.append(f"{finished} RunFinished")
    return bad


def run_rlx(*args: str, timeout_s: float = 600.0) -> tuple[bool, float, str]:
    """(exit status 0, seconds, the last lines of output) of an ``rlx`` command."""
    t = time.monotonic()
    done = subprocess.run(rlx(*args), stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                          env=child_env(), timeout=timeout_s)
    tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
    return done.returncode == 0, time.monotonic() - t, tail


def _rlx_ok(*args: str, timeout_s: float = 600.0) -> bool:
    return run_rlx(*args, timeout_s=timeout_s)[0]


def audit_ok(run_dir: str) -> bool:
    """``rlx audit DIR check`` is clean."""
    return _rlx_ok("audit", run_dir, "check")


def ledger_ok(run_dir: str) -> bool:
    """``rlx ledger verify DIR``: the hash chain and every event body are intact."""
    return _rlx_ok("ledger", "verify", run_dir)


def replay_ok(run_dir: str, *, regenerate: bool = False) -> bool:
    """``rlx replay DIR`` is bit-exact (with ``regenerate``: every rollout re-sampled too)."""
    return _rlx_ok("replay", run_dir, *(["--regenerate"] if regenerate else []))


def recovery_stats(kills: Sequence[Kill]) -> dict[str, dict]:
    """Per role: median and max seconds from a kill to the replacement's first delivery."""
    by_role: dict[str, list[float]] = {}
    for k in kills:
        if k.recovery_s is not None:
            by_role.setdefault(k.role, []).append(k.recovery_s)
    return {role: {"median": round(statistics.median(v), 2), "max": round(max(v), 2), "n": len(v)}
            for role, v in sorted(by_role.items())}


# --- a controller deployment on PostgreSQL ---------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _json_lines(path: str) -> list[dict]:
    out = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass
    except FileNotFoundError:
        pass
    return out


def fresh_schema(url: str) -> tuple[str, str]:
    """(a URL of the database ``url`` whose search path is a new, empty schema; its name): the
    deployment's ledger tables stay apart from whatever the database holds."""
    import uuid

    import psycopg

    schema = "rlx_chaos_" + uuid.uuid4().hex[:12]
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}", schema


def drop_schema(url: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


class LedgerTail:
    """The events of one run as they are appended (a read-only session per look)."""

    def __init__(self, url: str, run_id: str):
        self.url, self.run_id = url, run_id
        self.events: list = []

    def poll(self) -> list:
        from ledger import open_store

        with open_store(self.url, readonly=True) as store:
            if self.run_id in store.runs():
                self.events.extend(store.read(self.run_id, len(self.events) + 1))
        return self.events

    def submitted(self, epoch: int) -> bool:
        """Whether the controller of writer ``epoch`` (or a later one) appended a worker submission."""
        return any(s.epoch >= epoch and s.kind in SUBMISSIONS for s in self.poll())

    def finished(self) -> bool:
        return any(s.kind == "RunFinished" for s in self.poll())


def deploy_with_kills(url: str, config: str, workdir: str, *, kills: int, rng: random.Random,
                      max_wait_s: float = 0.5, timeout_s: float = RUN_TIMEOUT_S,
                      log=print) -> tuple[dict, list[Kill], str]:
    """``rlx controller`` on the ledger ``url`` with one ``rlx worker`` per role; the controller is
    SIGKILLed ``kills`` times (while the run is not finished), each time once the current one has
    appended a worker submission and ``uniform(0, max_wait_s)`` more seconds passed, and
    restarted on the same port.
    Returns (the last controller's final line, kills, run directory for audit)."""
    from runtime.rundir import write_run_pointer

    deadline = time.monotonic() + timeout_s
    run_id = f"chaos-{os.getpid()}-{int(time.time())}"
    run_dir = os.path.join(workdir, "deployment")
    os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
    write_run_pointer(run_dir, url, run_id)  # audit and ledger verify of run_dir find it
    port = free_port()
    target = f"127.0.0.1:{port}"
    env = child_env()
    token_file = os.path.join(run_dir, "controller.token")  # made by the first controller, kept by the next
    controllers: list[tuple[subprocess.Popen, str]] = []

    def start_controller() -> tuple[subprocess.Popen, str]:
        log_path = os.path.join(run_dir, "logs", f"controller.{len(controllers) + 1}.log")
        with open(log_path, "wb") as f:
            p = subprocess.Popen(rlx("controller", "--ledger", url, "--params", os.path.join(run_dir, "params"),
                                     "--listen", target, "--run", run_id, "--token-out", token_file, config),
                                 stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True)
        controllers.append((p, log_path))
        return p, log_path

    def listening(p: subprocess.Popen, log_path: str) -> int | None:
        """The epoch the controller announces once it listens (None: it found the run finished)."""
        while time.monotonic() < deadline:
            for line in _json_lines(log_path):
                if "listening" in line:
                    return int(line["epoch"])
            if p.poll() == 0 and any("final_digest" in line for line in _json_lines(log_path)):
                return None
            if p.poll() is not None:
                raise RuntimeError(f"rlx controller exited with {p.returncode}: {log_tail(log_path)}")
            time.sleep(0.05)
        raise RuntimeError(f"rlx controller did not listen in time: {log_tail(log_path)}")

    workers = []
    done: list[Kill] = []
    tail = LedgerTail(url, run_id)
    try:
        ctrl, ctrl_log = start_controller()
        epoch = listening(ctrl, ctrl_log)
        if epoch is None:
            raise RuntimeError(f"run {run_id!r} had finished before it started")
        for role in ROLES:
            with open(os.path.join(run_dir, "logs", f"{role}.log"), "wb") as f:
                workers.append(subprocess.Popen(rlx("worker", role, "--controller", target, "--worker-id",
                                                    f"{role}-0", "--retry-for", "120", "--token-file", token_file),
                                                stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                                env=env, start_new_session=True))
        while epoch is not None and len(done) < kills:
            while not tail.submitted(epoch):
                if ctrl.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the controller stopped before serving its workers: {log_tail(ctrl_log)}")
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, max_wait_s))
            if ctrl.poll() is not None or tail.finished():
                break
            ctrl.kill()
            k = Kill(CONTROLLER, CONTROLLER, f"epoch-{epoch}", ctrl.pid, time.time())
            ctrl.wait()
            done.append(k)
            log(f"kill {len(done)}/{kills}: controller of epoch {epoch} (pid {k.pid})")
            ctrl, ctrl_log = start_controller()
            epoch = listening(ctrl, ctrl_log)
        try:
            ctrl.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the controller deployment did not finish in time: {log_tail(ctrl_log)}") from None
        if ctrl.returncode != 0:
            raise RuntimeError(f"rlx controller exited with {ctrl.returncode}: {log_tail(ctrl_log)}")
        final = [line for line in _json_lines(ctrl_log) if "final_digest" in line][-1]
        for w in workers:
            w.wait(max(1.0, deadline - time.monotonic()))
        _controller_recoveries(url, run_id, done)
        return final, done, run_dir
    finally:
        for p in [c for c, _ in controllers] + workers:
            if p.poll() is None:
                kill_group(p)


def _controller_recoveries(url: str, run_id: str, kills: Sequence[Kill]) -> None:
    """Each controller kill recovers at the first worker submission a later controller appended."""
    stored = LedgerTail(url, run_id).poll()
    starts = [s for s in stored if s.kind == "ControllerStarted"]
    for k in kills:
        later = [s.epoch for s in starts if s.wall_time > k.t]
        if not later:
            continue
        after = [s for s in stored if s.epoch >= later[0] and s.kind in SUBMISSIONS]
        if after:
            k.recovered_t, k.replacement = after[0].wall_time, f"epoch-{later[0]}"


# --- main ------------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40, help="training steps of the run (default 40)")
    ap.add_argument("--kills", type=int, default=20, help="worker processes to SIGKILL (default 20)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the kills' roles and moments (default 0)")
    ap.add_argument("--run-seed", type=int, default=1, help="run.seed of the run (default 1)")
    ap.add_argument("--max-gap", type=float, default=1.5,
                    help="most seconds a role waits, once killable, before its kill (default 1.5)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                    help="override a config value of every run (repeatable)")
    ap.add_argument("--postgres", default=os.environ.get("RLX_TEST_POSTGRES_URL"), metavar="URL",
                    help="also kill the controller of an rlx controller deployment on this PostgreSQL ledger "
                         "(default: $RLX_TEST_POSTGRES_URL; off if unset)")
    ap.add_argument("--controller-kills", type=int, default=2, help="controller kills of the deployment (default 2)")
    ap.add_argument("--workdir", help="where the runs go (default: a new temporary directory)")
    ap.add_argument("--no-compile-cache", action="store_true",
                    help="start every process without the persistent XLA compilation cache")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (kept anyway when a check fails)")
    args = ap.parse_args(argv)
    global COMPILE_CACHE
    COMPILE_CACHE = not args.no_compile_cache

    workdir = args.workdir or tempfile.mkdtemp(prefix="rlx-chaos-")
    config = prepare(workdir, steps=args.steps, seed=args.run_seed)
    print(f"work directory: {workdir}", flush=True)
    timings: dict[str, float] = {}
    digests: dict[str, str] = {}
    rng = random.Random(args.seed)

    t = time.monotonic()
    chaos_dir = os.path.join(workdir, "chaos")
    summary, kills = run_with_kills(config, chaos_dir, kills=args.kills, seed=rng.randrange(2**32),
                                    overrides=args.overrides, max_gap_s=args.max_gap)
    timings["chaos_run_s"] = round(time.monotonic() - t, 1)
    worker_kills = len(kills)
    digests["chaos"] = summary["final_digest"]
    violations = ledger_violations(chaos_dir)
    audits = {"chaos": audit_ok(chaos_dir)}
    verified = {"chaos": ledger_ok(chaos_dir)}

    for mode in ("processes", "threads"):
        t = time.monotonic()
        out = os.path.join(workdir, mode)
        digests[mode] = run_plain(config, out, mode=mode, overrides=args.overrides)["final_digest"]
        timings[f"{mode}_run_s"] = round(time.monotonic() - t, 1)

    schema = None
    if args.postgres:
        t = time.monotonic()
        ledger_url, schema = fresh_schema(args.postgres)
        print(f"deployment ledger: schema {schema} of {args.postgres}", flush=True)
        final, controller_kills, deploy_dir = deploy_with_kills(ledger_url, config, workdir,
                                                                kills=args.controller_kills, rng=rng)
        timings["deployment_s"] = round(time.monotonic() - t, 1)
        digests["deployment"] = final["final_digest"]
        kills = kills + controller_kills
        violations += [f"deployment: {v}" for v in ledger_violations(deploy_dir)]
        audits["deployment"] = audit_ok(deploy_dir)
        verified["deployment"] = ledger_ok(deploy_dir)

    recovery = recovery_stats(kills)
    by_role = dict(sorted(Counter(k.role for k in kills).items()))
    medians = [r["median"] for r in recovery.values()]
    result = {
        "kills": by_role,
        "kills_total": len(kills),
        "unrecovered": sum(k.recovery_s is None for k in kills),
        "digest_match": len(set(digests.values())) == 1,
        "audit_ok": all(audits.values()),
        "ledger_verify_ok": all(verified.values()),
        "lost_events": len(violations),
        "violations": violations[:20],
        "recovery_s": recovery,
        "digests": digests,
        "timings": timings,
        "steps": args.steps,
        "seed": args.seed,
        "compile_cache": COMPILE_CACHE,
        "targets": {"worker_kills_in_one_run_at_least_20": worker_kills >= 20,
                    "median_recovery_at_most_15s": bool(medians) and max(medians) <= 15.0},
    }
    ok = result["digest_match"] and result["audit_ok"] and result["ledger_verify_ok"] and not violations
    if ok and not args.keep and not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
        if schema is not None:
            drop_schema(args.postgres, schema)
    print(json.dumps(result, sort_keys=True))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
