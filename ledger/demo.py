"""A simulated run written through the store: every event kind, with real arrays.

Used by ``rlx ledger demo`` and the ledger benchmark. Pure numpy; the "rollouts" are seeded
random tokens, the "verifier" rewards even token sums, the "weights" digests are hashes.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ledger import events as ev
from ledger.store import EventStore


def _digest(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def write_demo_run(store: EventStore, *, steps: int = 20, group_size: int = 4, groups: int = 4, seed: int = 0) -> str:
    """Append a simulated run of ``steps`` train steps; return its run id."""
    existing = set(store.runs())
    n = 0
    while f"demo-{n}" in existing:
        n += 1
    run_id = f"demo-{n}"
    store.create_run(run_id)
    epoch = store.acquire_epoch(run_id)
    head = store.append(run_id, [
        ev.RunStarted(run_id, {"demo": True, "steps": steps}, _digest("config", steps), seed),
        ev.ControllerStarted(epoch, 0),
        ev.WorkerJoined("inference-0", "inference"),
        ev.WorkerJoined("verifier-0", "verifier"),
        ev.WorkerJoined("trainer-0", "trainer"),
    ], expected_seq=0, epoch=epoch).seq
    rng = np.random.default_rng(seed)
    digest = _digest("v0")
    head = store.append(run_id, [ev.WeightsPublished(0, digest, -1, "")], expected_seq=head, epoch=epoch).seq
    rollout = 0
    for step in range(1, steps + 1):
        version = step - 1
        prompts = tuple(int(p) for p in rng.integers(0, 1000, size=groups))
        batch: list[ev.Event] = [ev.PromptsSampled(step, 0, prompts)]
        ids = []
        for g, p in enumerate(prompts):
            group = tuple(range(rollout, rollout + group_size))
            seeds = tuple(int(s) for s in rng.integers(2**31, size=group_size))
            batch.append(ev.RolloutRequested(group, (step - 1) * groups + g, step, p, version, seeds,
                                             {"temperature": 1.0, "max_tokens": 8}))
            batch.append(ev.RolloutAssigned("inference-0", group, (0,) * group_size))
            ids.extend(group)
            rollout += group_size
        head = store.append(run_id, batch, expected_seq=head, epoch=epoch).seq
        done: list[ev.Event] = []
        for rid in ids:
            tokens = rng.integers(0, 32, size=int(rng.integers(2, 9))).astype(np.int32)
            logprobs = (-rng.random(tokens.size)).astype(np.float32)
            done.append(ev.RolloutCompleted(rid, "inference-0", 0, version, digest, tokens, logprobs, "stop"))
            ok = int(tokens.sum()) % 2 == 0
            done.append(ev.OutcomeRecorded(rid, float(ok), ok, "AC" if ok else "WA", "demo-parity", "1"))
        head = store.append(run_id, done, expected_seq=head, epoch=epoch).seq
        group_ids = tuple(range((step - 1) * groups, step * groups))
        parent, digest = digest, _digest("v", step, digest)
        head = store.append(run_id, [
            ev.BatchFormed(step, group_ids, tuple(ids), (version,) * len(ids)),
            ev.TrainStepCompleted(step, _digest("batch", step), {"loss": float(rng.normal())}),
            ev.WeightsPublished(step, digest, step - 1, parent),
        ], expected_seq=head, epoch=epoch).seq
    store.append(run_id, [ev.WorkerLost("inference-0", "shutdown"), ev.RunFinished(steps, digest)],
                 expected_seq=head, epoch=epoch)
    return run_id
