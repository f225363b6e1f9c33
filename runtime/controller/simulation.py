"""Simulated workers: deterministic stand-ins for the model, verifier and trainer.

They follow the contracts of the real workers exactly — a rollout is a pure function of
(weights digest, prompt, sampling, seed), an outcome of (prompt, tokens), a train step of
(parent digest, batch) — but compute hashes instead of forward passes, so a whole run takes
milliseconds. The property tests, the golden histories and ``scripts/bench_controller.py``
drive the real controller and ledger with them.

Rewards are chosen so that DAPO filtering has work to do: every prompt whose index is a
multiple of 4 gets reward 0 for every sample (a "too hard" prompt), the others get 1 for an
even token sum.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

import numpy as np

from ledger import events as ev
from runtime.controller.loop import ControllerLoop
from runtime.controller.workers import INFERENCE, TRAINER, VERIFIER, InitTask, Lease, ScoreTask, TrainTask


def _h(*parts: object) -> bytes:
    h = hashlib.sha256()
    for p in parts:
        b = p if isinstance(p, bytes) else repr(p).encode()
        h.update(struct.pack("<Q", len(b)) + b)
    return h.digest()


def fake_rollout(weights_digest: str, prompt_index: int, seed: int, max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and log-probs a model with these weights would sample (a keyed hash)."""
    key = np.frombuffer(_h(weights_digest, prompt_index, seed), dtype=np.uint64)[:2]
    g = np.random.Generator(np.random.Philox(key=key))
    n = int(g.integers(1, max(2, max_tokens) + 1))
    return g.integers(0, 1000, size=n, dtype=np.int32), -g.random(n, dtype=np.float32)


class SimInference:
    """An inference worker that completes every lease it is given."""

    def __init__(self, worker_id: str, slots: int = 1, max_tokens: int = 8):
        self.worker_id, self.slots, self.max_tokens = worker_id, slots, max_tokens

    def generate(self, leases: Sequence[Lease]) -> list[ev.RolloutCompleted]:
        out = []
        for lease in leases:
            tokens, logprobs = fake_rollout(lease.weights_digest, lease.prompt_index, lease.seed, self.max_tokens)
            cap = lease.sampling["max_tokens"]  # as an engine, never more than the request's sampling.max_tokens
            tokens, logprobs = tokens[:cap], logprobs[:cap]
            out.append(ev.RolloutCompleted(lease.rollout_id, self.worker_id, lease.attempt, lease.policy_version,
                                           lease.weights_digest, tokens, logprobs, "stop"))
        return out


def fake_reward(prompt_index: int, tokens: np.ndarray) -> float:
    if prompt_index % 4 == 0:
        return 0.0
    return float(int(tokens.sum()) % 2 == 0)


class SimVerifier:
    """A verifier with the reward rule of the module docstring."""

    def __init__(self, worker_id: str = "verifier-0"):
        self.worker_id = worker_id

    def score(self, tasks: Sequence[ScoreTask]) -> list[ev.OutcomeRecorded]:
        out = []
        for t in tasks:
            reward = fake_reward(t.prompt_index, t.completion.tokens)
            out.append(ev.OutcomeRecorded(t.rollout_id, reward, reward > 0, "AC" if reward else "WA", "sim", "1"))
        return out


def batch_digest(task: TrainTask) -> str:
    """The content digest of a batch: prompts, seeds, versions, tokens, log-probs, rewards, in
    training order. Ids are left out on purpose: they depend on when requests were made."""
    h = hashlib.sha256()
    for r in task.rollouts:
        q, c, o = r.request, r.completion, r.outcome
        h.update(_h(q.prompt_index, q.seed, q.policy_version, c.tokens.tobytes(), c.logprobs.tobytes(), o.reward))
    return h.hexdigest()


class SimTrainer:
    """A trainer whose version ``s`` digest is ``sha256(digest(s-1) ‖ batch digest)``."""

    def __init__(self, worker_id: str = "trainer-0", seed: int = 0):
        self.worker_id, self.seed = worker_id, seed

    def initialize(self, task: InitTask) -> ev.WeightsPublished:
        return ev.WeightsPublished(0, _h("init", self.seed).hex(), -1, "")

    def train(self, task: TrainTask) -> tuple[ev.TrainStepCompleted, ev.WeightsPublished]:
        bd = batch_digest(task)
        rewards = [r.outcome.reward for r in task.rollouts]
        metrics = {"reward_mean": float(np.mean(rewards)), "rollouts": len(rewards)}
        digest = _h(task.parent_digest, bd).hex()
        return (ev.TrainStepCompleted(task.step, bd, metrics),
                ev.WeightsPublished(task.step, digest, task.parent_version, task.parent_digest))


def train_once(loop: ControllerLoop, trainer: SimTrainer) -> bool:
    """Run the trainer's next task, if any; True if one ran."""
    task = loop.train_task(trainer.worker_id)
    if task is None:
        return False
    if isinstance(task, InitTask):
        loop.publish([trainer.initialize(task)], worker_id=trainer.worker_id)
    else:
        loop.publish(list(trainer.train(task)), worker_id=trainer.worker_id)
    return True


def run_to_end(loop: ControllerLoop, *, workers: int = 2, slots: int = 4, max_rounds: int = 100_000) -> None:
    """Drive ``loop`` with simulated workers (round-robin, no faults) until the run finishes."""
    infer = [SimInference(f"inference-{i}", slots) for i in range(workers)]
    spec = loop.state.spec
    assert spec is not None  # a loop's run has started
    verifier, trainer = SimVerifier(), SimTrainer(seed=spec.seed)
    for w in infer:
        loop.join(w.worker_id, INFERENCE, slots=w.slots)
    loop.join(verifier.worker_id, VERIFIER)
    loop.join(trainer.worker_id, TRAINER)
    for _ in range(max_rounds):
        if loop.finished:
            return
        progressed = train_once(loop, trainer)
        for w in infer:
            leases = loop.leases(w.worker_id)
            if leases:
                loop.complete(w.generate(leases))
                progressed = True
        tasks = loop.scoring_work(verifier.worker_id, 1 << 30)
        if tasks:
            loop.record_outcomes(verifier.score(tasks))
            progressed = True
        if not progressed:
            raise RuntimeError(f"simulated run of {loop.run_id!r} is stuck (state {loop.state.formed=}, {loop.state.trained=})")
    raise RuntimeError(f"simulated run of {loop.run_id!r} did not finish in {max_rounds} rounds")
