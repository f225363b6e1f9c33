"""The inference worker: generates the rollouts of its leases with the engine. Stateless.

Each lease names the policy version and its weights digest; the worker loads that version from
the parameter store (keeping the last one in memory), swaps it into the engine without
recompiling, and generates. A completion depends only on (weights, prompt, sampling, seed), so a
lease redone by another worker, or by a replay, gives the same tokens and log-prob bits.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import cast

import numpy as np

from ledger.events import RolloutCompleted
from runtime.controller.workers import Lease
from runtime.errors import RlxError
from runtime.failpoints import failpoint
from runtime.inference import Engine, SamplingParams
from runtime.tasks.base import Task, TextCodec

ParamsLoader = Callable[[int], tuple[dict, str]]


def last_version_loader(store) -> ParamsLoader:
    """Loads versions from the parameter store ``store``, keeping only the last one in memory
    (an inference worker uses one version at a time)."""
    loaded: dict[int, tuple[dict, str]] = {}

    def load(version: int) -> tuple[dict, str]:
        if version not in loaded:
            loaded.clear()
            loaded[version] = (store.get(version), store.digest(version))
        return loaded[version]

    return load


class EngineWorker:
    """Generates completions for leases, grouped by policy version."""

    def __init__(self, worker_id: str, engine: Engine, task: Task, codec: TextCodec, load_params: ParamsLoader,
                 *, slots: int | None = None):
        self.worker_id = worker_id
        self.engine = engine
        self.task = task
        self.codec = codec
        self.load_params = load_params
        self.slots = slots or engine.max_slots
        self._loaded: tuple[int, str] | None = None
        self.generated_tokens = 0
        # A multi-turn task's rollouts are episodes of turns with its tools (runtime.episodes.rollout).
        self.episodes = None
        if getattr(task, "multi_turn", False):
            from runtime.episodes import ToolTask
            from runtime.episodes.rollout import EpisodeSampler

            tools = cast(ToolTask, task)
            self.episodes = EpisodeSampler(engine, lambda: tools.environment(codec), turn_tokens=tools.turn_tokens)

    def _use(self, version: int, digest: str) -> None:
        if self._loaded == (version, digest):
            return
        params, stored = self.load_params(version)
        if stored != digest:
            raise RlxError(f"version {version} in the parameter store has digest {stored[:16]}, "
                           f"the ledger names {digest[:16]}")
        self.engine.update_params(params)
        self._loaded = (version, digest)

    def prompt_tokens(self, prompt_index: int) -> np.ndarray:
        return self.codec.encode_prompt(self.task.problem("train", prompt_index))

    def generate(self, leases: Sequence[Lease]) -> list[RolloutCompleted]:
        by_version: dict[tuple[int, str], list[Lease]] = defaultdict(list)
        for lease in leases:
            by_version[(lease.policy_version, lease.weights_digest)].append(lease)
        out = []
        for (version, digest), group in sorted(by_version.items()):
            self._use(version, digest)
            params = [SamplingParams.from_request(lease.sampling, self.codec.eos_ids) for lease in group]
            seeds = [lease.seed for lease in group]
            if self.episodes is not None:
                problems = [self.task.problem("train", lease.prompt_index) for lease in group]
                for lease, e in zip(group, self.episodes.generate(problems, params, seeds), strict=True):
                    self.generated_tokens += int(sum(t["sampled"] for t in e.turns))
                    out.append(RolloutCompleted(lease.rollout_id, self.worker_id, lease.attempt, version, digest,
                                                e.tokens, e.logprobs, e.finish_reason, e.turns))
                continue
            completions = self.engine.generate(
                [self.prompt_tokens(lease.prompt_index) for lease in group], params, seeds)
            for lease, c in zip(group, completions, strict=True):
                self.generated_tokens += len(c.tokens)
                out.append(RolloutCompleted(
                    lease.rollout_id, self.worker_id, lease.attempt, version, digest,
                    np.asarray(c.tokens, np.int32), np.asarray(c.logprobs, np.float32), c.finish_reason,
                ))
        failpoint("inference.generate")
        return out
