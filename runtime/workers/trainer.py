"""The trainer worker: publishes version 0 and runs train steps. Stateless between steps.

Step ``s`` loads version ``s - 1`` (params and optimizer state) from the parameter store — or
reuses the copy it published itself, which is bit-identical — packs the batch in the logged order,
runs the pure ``train_step``, puts version ``s`` and answers with ``TrainStepCompleted`` and
``WeightsPublished``. Re-running a step gives the same digest.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from ledger.events import TrainStepCompleted, WeightsPublished
from runtime.controller.workers import InitTask, TrainTask
from runtime.episodes.rollout import completion_mask
from runtime.errors import RlxError
from runtime.failpoints import failpoint
from runtime.model import Model
from runtime.params import ParamStore
from runtime.tasks.base import Task, TextCodec
from runtime.trainer.batch import Sample, pack, pack_bins, shared_prefix
from runtime.trainer.mesh import shard_rows, shard_tree, to_host
from runtime.trainer.step import StepConfig, finite_leaves, make_optimizer, score, train_step


class NonFiniteWeights(RlxError):
    """A train step made weights with a NaN or an infinity in them: they are not published."""


class LogprobDivergence(RlxError):
    """With ``trainer.exact_logprobs``, a train step's log-prob of a sampled token differed from the
    engine's: the step is not published and the run stops, the message naming the token."""


def nonfinite_leaves(params) -> list[str]:
    """The paths of the leaves of ``params`` that hold a NaN or an infinity."""
    from runtime.params.tree import path_string

    finite = to_host(finite_leaves(params))
    paths = [path_string(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    return [path for path, ok in zip(paths, finite.tolist(), strict=True) if not ok]


class StepTrainer:
    """Runs ``train_step`` against the parameter store.

    ``keep_parents`` (the run's ``max_staleness``): how many of the versions it trained from it
    keeps in memory, one copy of the parameters each, for the old log-probs of the rollouts
    those versions sampled; a version it no longer holds is read back from the store.
    ``mesh`` (``runtime.trainer.mesh``): the device mesh its parameters, optimizer state and
    batches are laid out on; None, one device. ``gang`` (``runtime.trainer.gang``): the trainer
    gang this process is a rank of, whose ranks run every step together and each write their own
    shards of a version; None, a trainer of one process. ``store_opt_state``: each version is
    published with its optimizer state (what a resume or another trainer needs to train from it);
    False, with its parameters only, for a replay, whose next step trains from the state this
    trainer holds (``adopt`` hands it to another trainer).
    """

    def __init__(self, worker_id: str, model: Model, task: Task, codec: TextCodec, store: ParamStore, config: StepConfig,
                 *, group_size: int, width: int, keep_parents: int = 0, mesh=None, gang=None,
                 store_opt_state: bool = True):
        self.worker_id = worker_id
        self.model = model
        self.task = task
        self.codec = codec
        self.store = store
        self.config = config
        self.group_size = group_size
        self.width = width
        self.mesh = mesh
        self.gang = gang
        self.store_opt_state = store_opt_state
        # Version 0, the KL / preference reference; a copy, because train steps donate their inputs.
        self._reference = shard_tree(mesh, jax.tree.map(jnp.array, model.params))
        self._state: tuple[int, str, dict, object] | None = None  # version, digest, params, opt state
        # Older versions for old log-probs, by (version, digest): the parents of the last
        # ``keep_parents`` steps (copied before the step donates them) and the last one read.
        self.keep_parents = keep_parents
        self._versions: dict[tuple[int, str], dict] = {}
        self.last_metrics: dict[str, float] = {}

    # -- version 0 -------------------------------------------------------------------------------

    def initialize(self, task: InitTask) -> WeightsPublished:
        params = shard_tree(self.mesh, jax.tree.map(jnp.array, self.model.params))
        opt_state = make_optimizer(self.config).init(params)
        digest = self._publish(0, params, opt_state)
        return WeightsPublished(0, digest, -1, "")

    # -- steps -----------------------------------------------------------------------------------

    def step_config(self, samples: list[Sample]) -> StepConfig:
        """The step config for a batch of ``samples``: with ``share_prefix``, the prefix its
        groups share (``runtime.trainer.batch.shared_prefix``) is computed once per group."""
        if not self.config.share_prefix:
            return self.config
        return dataclasses.replace(self.config, prefix=shared_prefix(samples, self.group_size,
                                                                     self.config.prefix_per_octave))

    def _publish(self, version: int, params: dict, opt_state) -> str:
        """Store ``version`` (with its optimizer state when ``store_opt_state``) and train on from it."""
        digest = self.store.put(version, params, opt_state if self.store_opt_state else None, gang=self.gang)
        self._state = (version, digest, params, opt_state)
        return digest

    def adopt(self, other: StepTrainer) -> None:
        """Train on from the version ``other`` last trained or loaded, with its optimizer state (a
        replay's trainer for a fork's settings takes over from the run's at the fork)."""
        self._state = other._state

    def _parent(self, version: int, digest: str) -> tuple[dict, object]:
        if self._state is not None and self._state[:2] == (version, digest):
            return self._state[2], self._state[3]
        if self.store.digest(version) != digest:
            raise RuntimeError(f"parameter store version {version} does not match the ledger's digest")
        params = self.store.get(version)
        opt_state = self.store.get_opt_state(version)
        return shard_tree(self.mesh, params), shard_tree(self.mesh, opt_state)

    def _version_params(self, version: int, digest: str) -> dict | None:
        if self._state is not None and self._state[:2] == (version, digest):
            return self._state[2]
        if version == 0:
            return self._reference
        params = self._versions.get((version, digest))
        if params is None:
            if version not in self.store.versions():
                return None
            if self.store.digest(version) != digest:
                raise RuntimeError(f"parameter store version {version} does not match its rollouts' digest")
            params = shard_tree(self.mesh, self.store.get(version))
            self._keep(version, digest, params)
        return params

    def _keep(self, version: int, digest: str, params: dict) -> None:
        """Cache ``params`` as ``(version, digest)``, keeping the ``max(keep_parents, 1)``
        highest versions."""
        self._versions[(version, digest)] = params
        for key in sorted(self._versions, reverse=True)[max(self.keep_parents, 1):]:
            del self._versions[key]

    def prepare(self, task: TrainTask):
        """The step's inputs: ``(batch, device_batch, current_B, logp_old_BS, logp_ref_BS, config)``
        — the packed batch on the host and on the device, the on-policy rows, recomputed old and
        reference log-probs, and the step config for this batch (its shared prefix)."""
        samples = []
        for r in task.rollouts:
            problem = self.task.problem("train", r.request.prompt_index)
            samples.append(Sample(
                prompt=self.codec.encode_prompt(problem),
                completion=np.asarray(r.completion.tokens, np.int32),
                logprobs=np.asarray(r.completion.logprobs, np.float32),
                reward=float(r.outcome.reward),
                policy_version=int(r.completion.policy_version),
                mask=completion_mask(r.completion.turns, len(r.completion.tokens)) if r.completion.turns else None,
            ))
        config = self.step_config(samples)
        if config.pack:  # rows a multiple of the row shards and micro-batches, and of an eighth of the batch
            multiple = math.lcm(config.row_shards, max(config.micro_batch_size, 1), max(1, len(samples) // 8))
            batch = pack_bins(samples, group_size=self.group_size, width=self.width, pad_id=self.codec.pad_id,
                              multiple=multiple, align=max(config.exact_block, 1))
        else:
            batch = pack(samples, group_size=self.group_size, width=self.width, pad_id=self.codec.pad_id,
                         window=self.config.completion_window)
        device_batch = shard_rows(self.mesh, batch)
        current = batch.versions_B == task.parent_version
        logp_old = np.zeros(batch.mask_BS.shape, np.float32)
        digests = {r.completion.policy_version: r.completion.weights_digest for r in task.rollouts}
        for v in sorted(set(batch.versions_B.tolist()) - {task.parent_version}):
            rows = batch.versions_B == v
            if config.old_logprobs == "behaviour":  # the log-probs the engine sampled them with
                logp_old[rows] = batch.behaviour_BS[rows]
                continue
            vp = self._version_params(v, digests[v])
            if vp is None:
                raise RlxError(
                    f"step {task.step} needs version {v} for the old log-probs of its rollouts, but the "
                    f"parameter store no longer has it (stored: {list(self.store.versions())})"
                )
            logp_old[rows] = to_host(self._score(vp, device_batch, config))[rows]
        if self.config.needs_reference:
            logp_ref = self._score(self._reference, device_batch, config)
        else:
            logp_ref = jnp.zeros(batch.mask_BS.shape, jnp.float32)
        current, logp_old, logp_ref = shard_rows(self.mesh, (current, logp_old, logp_ref))
        return batch, device_batch, current, logp_old, logp_ref, config

    def _divergence(self, task: TrainTask, batch, device_batch, config: StepConfig) -> str:
        """The first on-policy token whose trainer log-prob is not the engine's, in one line."""
        params = shard_tree(self.mesh, self.store.get(task.parent_version))
        logp = to_host(self._score(params, device_batch, config))
        mask = batch.mask_BS & (batch.versions_B == task.parent_version)[:, None]
        rows, targets = np.nonzero(mask & (logp != batch.behaviour_BS))
        head = f"step {task.step}: trainer.exact_logprobs requires the trainer's log-probs to be the engine's"
        if not rows.size:
            return f"{head}, and the train step's were not (log-prob mismatch {batch.digest()})"
        b, t = int(rows[0]), int(targets[0])
        r = task.rollouts[b]
        position = t - int(np.argmax(batch.mask_BS[b]))
        return (f"{head}: rollout {r.completion.rollout_id} (version {r.completion.policy_version}), completion token "
                f"{position}: engine {float(batch.behaviour_BS[b, t])!r}, trainer {float(logp[b, t])!r} "
                f"({rows.size} tokens differ)")

    def _score(self, params, device_batch, config: StepConfig):
        args = (params, device_batch.tokens_BT, device_batch.attention_BT, device_batch.mask_BS, device_batch.rows_BS)
        if self.gang is not None:
            self.gang.together(score, *args, config=config)
        return score(*args, config=config)

    def train(self, task: TrainTask) -> tuple[TrainStepCompleted, WeightsPublished]:
        params, opt_state = self._parent(task.parent_version, task.parent_digest)
        batch, device_batch, current, logp_old, logp_ref, config = self.prepare(task)
        if self.keep_parents > 0 and config.old_logprobs == "recompute":
            # the next steps' old log-probs, without reading the store
            self._keep(task.parent_version, task.parent_digest, jax.tree.map(jnp.array, params))
        if self.gang is not None:  # the ranks start the step's collectives together
            self.gang.together(train_step, params, opt_state, device_batch, logp_old, logp_ref, current, config=config)
        new_params, new_opt, metrics = train_step(
            params, opt_state, device_batch, logp_old, logp_ref, current, config=config
        )
        # The compiler picks the step's output layouts; the next step starts from the mesh's.
        new_params, new_opt = shard_tree(self.mesh, new_params), shard_tree(self.mesh, new_opt)
        bad = nonfinite_leaves(new_params)
        if bad:
            raise NonFiniteWeights(
                f"step {task.step} made non-finite weights (NaN or inf in {', '.join(bad[:3])}"
                f"{f' and {len(bad) - 3} more' if len(bad) > 3 else ''}): version {task.step} is not published and "
                f"the run stops; `rlx audit step {task.step}` shows the batch it was trained on")
        failpoint("trainer.step")
        metrics = {k: float(v) for k, v in sorted(metrics.items())}
        if config.exact_block > 0 and metrics["logprob_mismatch_max"] != 0.0:
            raise LogprobDivergence(self._divergence(task, batch, device_batch, config))
        metrics["pass_rate"] = float(np.mean([r.outcome.passed for r in task.rollouts]))
        metrics["staleness_max"] = float(task.step - 1 - int(batch.versions_B.min()))
        metrics["staleness_mean"] = float(np.mean(task.step - 1 - batch.versions_B))
        digest = self._publish(task.step, new_params, new_opt)
        self.last_metrics = metrics
        return (
            TrainStepCompleted(task.step, batch.digest(), metrics),
            WeightsPublished(task.step, digest, task.parent_version, task.parent_digest),
        )
