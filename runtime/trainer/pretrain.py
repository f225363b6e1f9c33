"""Supervised warm start: cross-entropy on the target tokens of a task's training problems.

A tiny model trained from scratch has a zero pass rate, so RL has no signal. A short supervised
phase on the task's reference completions (answer + ``<eos>``) brings it to a non-zero pass rate;
RL then improves on that. The result depends only on (task, model config, steps, batch size,
learning rate, seed) and is cached on disk under a digest of those, so a rerun reuses it. The
processes of one run (the host and its workers) that need the same warm start at once take turns
on a lock file beside it: one trains it, the others wait and load its copy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from runtime import rng
from runtime.config import PretrainConfig
from runtime.errors import UsageError
from runtime.model import Model, forward, load_hf, save_hf
from runtime.progress import Progress
from runtime.tasks.base import Task, TextCodec
from runtime.trainer.optimizer import OptimizerConfig, transformation


def pack_supervised(task: Task, codec: TextCodec, indices, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(tokens_BT, attention_BT, target_mask_BS)`` for prompt + target + ``<eos>`` rows, padded
    with the codec's pad id; a task with ``demonstration`` (``runtime.episodes.ToolTask``) gives
    worked multi-turn episodes instead, trained on the model's ids only."""
    B = len(indices)
    tokens = np.full((B, width), codec.pad_id, np.int32)
    attention = np.zeros((B, width), bool)
    mask = np.zeros((B, width - 1), bool)
    demonstration = getattr(task, "demonstration", None)  # a multi-turn task's worked episodes
    for b, i in enumerate(indices):
        demo = None if demonstration is None else demonstration(int(i), codec)
        if demo is not None:
            row, trained = demo[0][:width], demo[1][:width]
            tokens[b, : len(row)] = row
            attention[b, : len(row)] = True
            mask[b, : len(row) - 1] = trained[1:]
            continue
        p = task.problem("train", int(i))
        prompt = codec.encode_prompt(p)
        target = codec.target_ids(p)
        row = np.concatenate([prompt, np.asarray(target, np.int32)])[:width]
        tokens[b, : len(row)] = row
        attention[b, : len(row)] = True
        mask[b, len(prompt) - 1 : len(row) - 1] = True
    return tokens, attention, mask


# optax.adamw's default weight decay, which the warm start has always trained with: the cached warm
# starts (``cache_key``, which leaves it out) were made with it.
WEIGHT_DECAY = 1e-4


def warm_start_optimizer(config: PretrainConfig) -> OptimizerConfig:
    """The warm start's optimizer (``runtime.trainer.optimizer``): AdamW with the constant
    ``pretrain.learning_rate`` and a weight decay of :data:`WEIGHT_DECAY`, without clipping."""
    return OptimizerConfig(learning_rate=config.learning_rate, weight_decay=WEIGHT_DECAY)


@functools.partial(jax.jit, static_argnames=("model_config", "optimizer"), donate_argnames=("params", "opt_state"))
def _sft_step(params, opt_state, tokens_BT, attention_BT, mask_BS, *, model_config, optimizer: OptimizerConfig):
    def loss_fn(p):
        logits = forward(p, tokens_BT, attention_BT, config=model_config)[:, :-1]
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, tokens_BT[:, 1:, None], axis=-1)[..., 0]
        return jnp.sum(jnp.where(mask_BS, nll, 0.0)) / jnp.maximum(jnp.sum(mask_BS), 1).astype(nll.dtype)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = transformation(optimizer).update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def warm_start(model: Model, task: Task, codec: TextCodec, config: PretrainConfig, *, seed: int, width: int,
               progress=None) -> tuple[Model, list[float]]:
    """Train ``model`` on the task's reference completions, prompts and targets encoded by
    ``codec`` (batches drawn with run seed ``seed``); return it and the loss curve."""
    opt = warm_start_optimizer(config)
    params = jax.tree.map(jnp.array, model.params)
    state = transformation(opt).init(params)
    batches = rng.generator(seed, rng.WARM_START)
    pool = task.supervised_indices()
    if pool is not None and len(pool) == 0:
        raise UsageError(f"pretrain.steps is {config.steps} but no training problem has a target to learn "
                         "(an answer or a target); set pretrain.steps=0 or add targets")
    losses = []
    for step in range(config.steps):
        if pool is None:
            idx = batches.integers(task.train_size, size=config.batch_size)
        else:
            idx = pool[batches.integers(len(pool), size=config.batch_size)]
        tokens, attention, mask = pack_supervised(task, codec, idx, width)
        params, state, loss = _sft_step(
            params, state, tokens, attention, mask, model_config=model.config, optimizer=opt
        )
        losses.append(float(loss))
        if progress is not None:
            progress(step + 1, losses[-1])
    return model.with_params(params), losses


def cache_key(model: Model, task: Task, config: PretrainConfig, seed: int, width: int,
              codec: TextCodec | None = None) -> str:
    """Digest of everything the warm start depends on (not where it is cached or how it is
    evaluated); a codec that renders a chat template or differs from the built-in one in its
    special ids counts too."""
    ident = {
        "model": dataclasses.asdict(model.config),
        "init": hashlib.sha256(b"".join(np.asarray(x).tobytes() for x in jax.tree.leaves(model.params))).hexdigest(),
        "task": task.describe(),
        "pretrain": {"steps": config.steps, "batch_size": config.batch_size,
                     "learning_rate": config.learning_rate, "seed": seed},
        "width": width,
        "format": 2,
    }
    if codec is not None and codec.template is not None:
        ident["chat_template"] = codec.template_digest
    if codec is not None and not codec.char_level:
        ident["text"] = {"bos": codec.bos_id, "eos": list(codec.eos_ids), "pad": codec.pad_id,
                         "tokenizer": hashlib.sha256(codec.tokenizer.to_str().encode()).hexdigest()}
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:20]


def cached_warm_start(model: Model, task: Task, codec: TextCodec, config: PretrainConfig, *, seed: int, width: int,
                      cache_dir: str, progress: bool = False, log=None) -> tuple[Model, str, bool]:
    """``warm_start`` through an on-disk cache; returns (model, checkpoint dir, loaded_from_cache).
    ``log`` (if given) is told first whether the warm start loads from the cache or trains; with
    ``progress`` the training steps are shown on stderr (``runtime.progress``)."""
    path = os.path.join(cache_dir, cache_key(model, task, config, seed, width, codec))
    with _turn(path, log):
        return _cached_warm_start(model, task, codec, config, seed=seed, width=width, path=path,
                                  progress=progress, log=log)


@contextlib.contextmanager
def _turn(path: str, log):
    """Hold the lock file ``path.lock`` (the cache directory is created for it); say so when
    another process holds it, which is then training the same warm start. The lock goes with its
    process, so a killed one never leaves it taken."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if log is not None:
                log(f"warm start: another process is training it; waiting for its copy ({path})")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _cached_warm_start(model: Model, task: Task, codec: TextCodec, config: PretrainConfig, *, seed: int, width: int,
                       path: str, progress: bool, log) -> tuple[Model, str, bool]:
    if os.path.isfile(os.path.join(path, "config.json")):
        if log is not None:
            log(f"warm start: loading {config.steps} supervised steps from the cache ({path})")
        loaded = load_hf(path, dtype=model.config.dtype)  # a checkpoint keeps no compute dtype
        return loaded, path, True
    if log is not None:
        log(f"warm start: training {config.steps} supervised steps of {config.batch_size} problems (not in the cache; "
            f"kept in {path} for the next run with the same model, data and pretrain section)")
    with Progress("warm start", config.steps, enabled=progress) as bar:
        trained, _ = warm_start(model, task, codec, config, seed=seed, width=width,
                                progress=lambda done, loss: bar.update(done, f"loss {loss:.3f}"))
    tmp = path + f".tmp{os.getpid()}"
    save_hf(tmp, trained)
    try:
        os.rename(tmp, path)
    except OSError:  # another process finished first: use its copy
        pass
    return load_hf(path, dtype=model.config.dtype), path, False


__all__ = ["cached_warm_start", "pack_supervised", "warm_start", "warm_start_optimizer"]
