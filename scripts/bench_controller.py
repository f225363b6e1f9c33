"""Controller + ledger throughput on an RLAX-shaped workload with simulated workers.

Workload (defaults): 1,000 inference workers with one slot each, groups of 16, batches of 512
rollouts (32 groups), deterministic mode with max_staleness 1, rollouts of 128 tokens, a SQLite
ledger in WAL mode with synchronous=FULL. Workers report completions in chunks (``--chunk``), as
a service front end would group concurrent submissions into one transaction.

Measured:
- ``completions_per_s``: rollout completions divided by the time spent inside the controller
  and the ledger (admission, fold, decide, encoding, SQLite commit) — the simulated workers'
  own time is excluded; ``wall_completions_per_s`` includes it.
- ``decisions_per_s``: decisions appended per second of controller + ledger time.
- ``replay_eps``: events per second read back from SQLite, decoded and folded with every
  decision re-checked (``replay``); ``fold_eps`` the same without decision checks.

Usage: ``python scripts/bench_controller.py [--steps 6] [--workers 1000] …``; the last line
printed is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ledger import events as ev  # noqa: E402
from ledger.sql import SqliteStore  # noqa: E402
from runtime.config import load_config  # noqa: E402
from runtime.controller import DECISION_KINDS, ControllerLoop, replay  # noqa: E402
from runtime.controller.simulation import SimTrainer, fake_reward  # noqa: E402
from runtime.controller.workers import INFERENCE, TRAINER, VERIFIER, InitTask  # noqa: E402


class Timed:
    """Accumulates the time spent in the wrapped loop's calls."""

    def __init__(self, loop: ControllerLoop):
        self.loop, self.seconds = loop, 0.0

    def __call__(self, name: str, *args, **kwargs):
        t = time.perf_counter()
        try:
            return getattr(self.loop, name)(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=1000)
    p.add_argument("--group-size", type=int, default=16)
    p.add_argument("--batch", type=int, default=512, help="rollouts per batch")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--staleness", type=int, default=1)
    p.add_argument("--mode", default="deterministic")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--chunk", type=int, default=64, help="completions per submission")
    p.add_argument("--sync", default="FULL", help="SQLite synchronous mode")
    args = p.parse_args(argv)

    groups = args.batch // args.group_size
    config = load_config(None, [
        f"run.steps={args.steps}", f"sampling.group_size={args.group_size}",
        f"scheduling.groups_per_batch={groups}", f"scheduling.max_staleness={args.staleness}",
        f"scheduling.mode={args.mode}",
    ], data_size=100_000)
    rng = np.random.default_rng(0)
    pool = [(rng.integers(0, 32000, args.tokens, dtype=np.int32), -rng.random(args.tokens, dtype=np.float32))
            for _ in range(64)]

    with tempfile.TemporaryDirectory(prefix="rlx-bench-") as tmp:
        store = SqliteStore("sqlite:///" + os.path.join(tmp, "ledger.db"), create=True, synchronous=args.sync)
        loop = ControllerLoop.create(store, run_id="bench", config=config.to_dict(), config_digest=config.digest(),
                                     seed=config.run.seed)
        workers = [f"inference-{i:04d}" for i in range(args.workers)]
        joins = [ev.WorkerJoined(w, INFERENCE, {}, 1) for w in workers]
        loop.submit(joins + [ev.WorkerJoined("verifier-0", VERIFIER), ev.WorkerJoined("trainer-0", TRAINER)])
        for w in workers:
            loop.heartbeat(w)
        call = Timed(loop)
        trainer = SimTrainer(seed=config.run.seed)
        completions = 0
        wall0 = time.perf_counter()
        while not loop.finished:
            task = call("train_task", "trainer-0")
            if isinstance(task, InitTask):
                call("publish", [trainer.initialize(task)], worker_id="trainer-0")
            elif task is not None:
                call("publish", list(trainer.train(task)), worker_id="trainer-0")
            done = []
            for w in workers:
                for lease in call("leases", w):
                    tokens, logprobs = pool[lease.seed % len(pool)]
                    done.append(ev.RolloutCompleted(lease.rollout_id, w, lease.attempt, lease.policy_version,
                                                    lease.weights_digest, tokens, logprobs, "stop"))
            for i in range(0, len(done), args.chunk):
                call("complete", done[i : i + args.chunk])
            completions += len(done)
            tasks = call("scoring_work", "verifier-0", 1 << 30)
            outcomes = [ev.OutcomeRecorded(t.rollout_id, r, r > 0, "AC" if r else "WA", "sim", "1")
                        for t in tasks for r in [fake_reward(t.prompt_index, t.completion.tokens)]]
            for i in range(0, len(outcomes), args.chunk):
                call("record_outcomes", outcomes[i : i + args.chunk])
        wall = time.perf_counter() - wall0
        live_seconds = call.seconds
        store.close()

        store = SqliteStore("sqlite:///" + os.path.join(tmp, "ledger.db"))
        t = time.perf_counter()
        stored = list(store.read("bench"))
        read_s = time.perf_counter() - t
        t = time.perf_counter()
        state = replay(stored)
        check_s = time.perf_counter() - t
        t = time.perf_counter()
        replay(stored, check=False)
        fold_s = time.perf_counter() - t
        assert state.finished and state == loop.state
        n = len(stored)
        decisions = sum(type(s.event) in DECISION_KINDS for s in stored)
        size = os.path.getsize(os.path.join(tmp, "ledger.db")) + (
            os.path.getsize(os.path.join(tmp, "ledger.db-wal")) if os.path.exists(os.path.join(tmp, "ledger.db-wal")) else 0)
        store.close()

    result = {
        "workload": {"workers": args.workers, "group_size": args.group_size, "batch": args.batch,
                     "steps": args.steps, "max_staleness": args.staleness, "mode": args.mode,
                     "tokens": args.tokens, "chunk": args.chunk, "sqlite_synchronous": args.sync},
        "events": n,
        "decisions": decisions,
        "completions": completions,
        "ledger_bytes": size,
        "completions_per_s": round(completions / live_seconds, 1),
        "wall_completions_per_s": round(completions / wall, 1),
        "decisions_per_s": round(decisions / live_seconds, 1),
        "live_events_per_s": round(n / live_seconds, 1),
        "replay_eps": round(n / (read_s + check_s), 1),
        "replay_fold_only_eps": round(n / check_s, 1),
        "fold_eps": round(n / (read_s + fold_s), 1),
        "read_decode_eps": round(n / read_s, 1),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
