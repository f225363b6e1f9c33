"""The train step: a pure, jitted function of (params, optimizer state, batch, config).

Log-probs are recomputed with the sampler's definition (``kernels.logprobs``: temperature divides
the logits before the log-softmax, float32); advantages come from ``kernels.advantages``; the loss
is the unified objective of ``kernels.objectives``; the update is optax. Shapes are fixed for the
whole run, reductions are over fixed axes and rollouts arrive in a fixed order, so the same
inputs give the same bits (on the same software stack and core count).

Old log-probs: ``π_old`` is the policy each rollout was sampled from. Rows sampled from the
version being trained (on-policy, ``current_B``) use the step's own forward pass; older rows use
``logp_old_BS``: recomputed by :func:`score` with that version's weights
(``old_logprobs="recompute"``), or the engine's own log-probs (``"behaviour"``), which spares a
forward pass a step when the engine and the trainer agree to float32 rounding. The difference
between the trainer's old log-probs and the engine's (``behaviour``) is the inference/trainer
mismatch.

Memory. By default the step is one forward and backward pass over the whole batch, with float32
logits ``[B, T, V]``. Three settings bound its memory, each independent of the others:

- ``logits_chunk``: log-probs ``logits_chunk`` positions at a time, each chunk's logits
  computed from the hidden states under ``jax.checkpoint`` (the backward pass recomputes them),
  so no ``[B, T, V]`` array exists, only ``[rows, logits_chunk, V]``.
- ``remat``: every decoder layer rematerialised in the backward pass, its attention a block of
  queries at a time (``kernels.attention.query_blocked_attention``) and its MLP a block of
  positions at a time, its weights cast where the layer runs (``runtime.model.transformer``).
- ``micro_batch_size``: the batch in micro-batches of that many rows, in two passes. Every
  objective depends on the parameters only through the log-probs ``ℓ`` of the batch, so
  ``∇θ L = Σ_{b,t} ∂L/∂ℓ_{b,t} · ∇θ ℓ_{b,t}``. The first pass computes ``ℓ`` micro-batch by
  micro-batch (forward only); the objective then runs on the whole batch as it does without
  micro-batches (advantages, group statistics, normalisers, KTO's reference point, DPO's pairs
  are all whole-batch quantities) and gives the loss, its metrics and the cotangent
  ``∂L/∂ℓ [B, T-1]``; the second pass adds each micro-batch's ``Σ ∂L/∂ℓ · ∇θ ℓ`` to the
  gradient, in micro-batch order (``lax.scan``; ``runtime.trainer.accumulate``, which writes the
  LM head's and the embedding's gradients into the accumulator in place, and with ``remat`` each
  layer's gradient as soon as its backward pass ends); the optimizer then updates one parameter
  after the other (``runtime.trainer.optimizer.update_leaf_by_leaf``, optax's arithmetic). Loss
  and gradient are the whole batch's up to float rounding; the same configuration always gives
  the same bits. It costs one more forward pass.

Shared prompts. The ``G`` rows of a group start with the same prompt, so the whole-batch forward
(without micro-batches, chunks or remat) can compute the first ``prefix`` positions once per group
and the rest of every row against the group's keys and values: for the demo's 9-token prompts
and 5-token completions that is ``32·9 + 256·5`` positions instead of ``256·14``, forward and
backward. The log-probs are the full forward's up to float32 rounding; which path a step took is
part of its config, so a replay takes it again.

``model.dtype = "bfloat16"`` (with float32 ``param_dtype``) computes in bfloat16 from float32
master weights: flax casts each weight to bfloat16 where it is used, so gradients and the
optimizer state stay float32; norms, attention softmax, logits and log-probs are float32.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

from kernels.advantages import gae_advantages, group_advantages, token_rewards, whiten
from kernels.aggregation import masked_mean
from kernels.algorithms import DPOObjective, KTOObjective, Objective, PolicyObjective
from kernels.kl import token_kl
from kernels.logprobs import exact_token_logprobs, token_logprobs_and_entropy
from kernels.objectives import policy_loss, preference_loss
from kernels.reward_shaping import overlong_penalty
from runtime.config import OLD_LOGPROBS, TrainerConfig
from runtime.errors import UsageError
from runtime.model import ModelConfig, forward
from runtime.model.transformer import (
    exact_head,
    exact_hidden,
    exact_rows,
    head_logits,
    hidden_states,
    shared_prefix_forward,
)
from runtime.numerics import pad_rows, padded_rows
from runtime.trainer.accumulate import accumulate, blocked_head_logits, head_weight
from runtime.trainer.batch import TrainBatch
from runtime.trainer.optimizer import OptimizerConfig, transformation, update_leaf_by_leaf
from runtime.trainer.optimizer import standard_promotion as standard_promotion  # re-exported: its first home

sg = jax.lax.stop_gradient


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """Everything static about a train step (hashable: a static argument of ``jit``).

    A run's step is :meth:`of` its ``trainer`` section, whose defaults are the step's: the
    optimizer (``runtime.trainer.optimizer``; Adam's ``adam_b1``, ``adam_b2``, ``adam_eps`` are
    the optimizer's own) and the memory bounds (see the module docstring). ``group_size`` rows in
    a row share their prompt; with ``share_prefix`` the trainer sets ``prefix`` per batch to the
    tokens they all share, and the whole-batch forward computes those once per group
    (``runtime.model.transformer.shared_prefix_forward``); ``prefix = 0`` computes every row in
    full; ``prefix_per_octave``: how finely that prefix follows the batch's shortest prompt
    (``runtime.trainer.batch.shared_prefix``). ``completion_window``: ``C > 0`` computes logits and log-probs only at the ``C`` positions
    from each row's first completion target (every completion must fit in them), not at every
    position (see :func:`_window_logprobs`); 0, at every position. ``old_logprobs``: ``"recompute"`` (the trainer scores rows sampled from an older version
    with that version's weights) or ``"behaviour"`` (their old log-probs are the engine's; the
    log-prob mismatch metrics then cover the on-policy rows only). ``fixed_order_mesh``: the
    device mesh (``runtime.trainer.mesh``) over whose row shards the gradient is summed in a fixed
    order (``trainer.deterministic_reduction``, see :func:`_fixed_order_grads`); None, the
    compiler's reductions. ``pack``: the trainer packs several sequences into each row
    (``runtime.trainer.batch.pack_bins``); the forward runs over the packed rows and the objective
    sees each sample's values gathered back by row (:func:`_unpacked`). ``row_shards``: the devices a batch's rows are split over (a mesh's
    ``data × fsdp``); with micro-batches each one takes the same share of every shard's rows
    (:func:`_split`), so every device works on every micro-batch and no rows move between them.
    ``exact_block``: > 0, exact log-probs (``trainer.exact_logprobs``, ``runtime.numerics``): the
    forward pass computes every log-prob with the exact engine's bits for pages of this many
    tokens (:func:`_exact_logprobs`); set from ``workers.page_size`` by the step's builder.
    """

    model: ModelConfig
    objective: Objective
    learning_rate: float = TrainerConfig.learning_rate
    weight_decay: float = TrainerConfig.weight_decay
    max_grad_norm: float = TrainerConfig.max_grad_norm
    warmup_steps: int = TrainerConfig.warmup_steps
    adam_b1: float = OptimizerConfig.adam_b1
    adam_b2: float = OptimizerConfig.adam_b2
    adam_eps: float = OptimizerConfig.adam_eps
    temperature: float = 1.0
    micro_batch_size: int = TrainerConfig.micro_batch_size
    logits_chunk: int = TrainerConfig.logits_chunk
    remat: bool = TrainerConfig.remat
    group_size: int = 1
    share_prefix: bool = False  # what an unset trainer.shared_prefix reads as
    prefix: int = 0
    old_logprobs: str = OLD_LOGPROBS[0]  # "recompute", what an unset trainer.old_logprobs reads as
    completion_window: int = 0
    prefix_per_octave: int = 1  # powers of two, what an unset trainer.prefix_per_octave reads as
    fixed_order_mesh: Any = None
    row_shards: int = 1
    pack: bool = False
    exact_block: int = 0

    @classmethod
    def of(cls, trainer: TrainerConfig, *, model: ModelConfig, objective: Objective, temperature: float,
           group_size: int) -> StepConfig:
        """The step a run's ``trainer`` section describes, for its model, its objective and its
        sampling ``temperature`` and ``group_size``.

        Each field of :data:`SECTION_FIELDS` is the section's field it names; one the section
        leaves unset (None: a run logged before the option existed) is the step's default, which
        is how such a run trained. ``prefix`` is set per batch, and ``fixed_order_mesh`` from
        ``trainer.mesh`` and ``trainer.deterministic_reduction`` by the trainer's builder
        (``runtime.session.make_trainer``).
        """
        values: dict[str, Any] = {}
        for name, section_name in SECTION_FIELDS.items():
            value = getattr(trainer, section_name)
            if value is not None:
                values[name] = value
        return cls(model=model, objective=objective, temperature=temperature, group_size=group_size, **values)

    @property
    def optimizer(self) -> OptimizerConfig:
        """The step's optimizer: its fields of the optimizer config's names."""
        return OptimizerConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(OptimizerConfig)})

    def micro_batches(self, rows: int) -> int:
        """How many micro-batches a batch of ``rows`` rows is split into (1: none); on a mesh each
        takes ``micro_batch_size / row_shards`` rows of every row shard."""
        m = self.micro_batch_size
        if m <= 0 or m >= rows:
            return 1
        if rows % m or m % self.row_shards:
            raise UsageError(
                f"trainer.micro_batch_size={m} does not divide the batch of {rows} rows into micro-batches "
                f"that split over the mesh's {self.row_shards} row shards; accepted: 0 (whole batch) or a "
                f"divisor of the batch size that is a multiple of {self.row_shards}"
            )
        return rows // m

    @property
    def needs_reference(self) -> bool:
        o = self.objective
        return isinstance(o, (DPOObjective, KTOObjective)) or (
            isinstance(o, PolicyObjective) and o.kl_coef > 0
        )


_RENAMED = {"share_prefix": "shared_prefix"}  # a step field and the trainer field of another name it reads
_TRAINER_NAMES = {f.name for f in dataclasses.fields(TrainerConfig)}
SECTION_FIELDS: dict[str, str] = {
    f.name: _RENAMED.get(f.name, f.name) for f in dataclasses.fields(StepConfig)
    if _RENAMED.get(f.name, f.name) in _TRAINER_NAMES
}
"""The step's fields that :meth:`StepConfig.of` reads from the ``trainer`` section, each with the
section's field it reads: those of the same name, and ``share_prefix`` from ``shared_prefix``."""


def make_optimizer(config: StepConfig) -> optax.GradientTransformation:
    """The step's optimizer (``runtime.trainer.optimizer``): global-norm clipping, then AdamW
    with the step's learning rate, warm-up, weight decay and Adam parameters."""
    return transformation(config.optimizer)


def _chunked_logprobs(params, tokens_BT, attention_BT, config: StepConfig):
    """``_token_logprobs`` ``logits_chunk`` positions at a time (see the module docstring)."""
    B, T = tokens_BT.shape
    S, C = T - 1, config.logits_chunk
    N = -(-S // C)
    h_BTD = hidden_states(
        params, tokens_BT, attention_BT, config=config.model, remat=config.remat
    )
    # The last position predicts nothing; padding to N·C positions adds rows that are dropped.
    h_BSD = jnp.pad(h_BTD[:, :-1], ((0, 0), (0, N * C - S), (0, 0)))
    targets_BS = jnp.pad(tokens_BT[:, 1:], ((0, 0), (0, N * C - S)))
    h_NBCD = jnp.moveaxis(h_BSD.reshape(B, N, C, -1), 1, 0)
    targets_NBC = jnp.moveaxis(targets_BS.reshape(B, N, C), 1, 0)

    @jax.checkpoint
    def chunk(inputs):
        h_BCD, targets_BC = inputs
        logits_BCV = blocked_head_logits(head_weight(params, config.model), h_BCD, config=config.model)
        return token_logprobs_and_entropy(logits_BCV, targets_BC, config.temperature)

    logp_NBC, entropy_NBC = jax.lax.map(chunk, (h_NBCD, targets_NBC))

    def unchunk(x_NBC):
        return jnp.moveaxis(x_NBC, 0, 1).reshape(B, N * C)[:, :S]

    return unchunk(logp_NBC), unchunk(entropy_NBC)


def _window_logprobs(params, tokens_BT, attention_BT, mask_BS, config: StepConfig):
    """``_token_logprobs`` at each row's completion window only; 0 at every other position.

    Row ``b``'s window is the ``C = completion_window`` positions from its first completion target
    (the first True of ``mask_BS[b]``), which hold all of its completion when the completion has at
    most ``C`` tokens (``pack`` checks). The LM head, the log-softmax and the entropy run over
    ``[B, C, V]`` instead of ``[B, T-1, V]``: for prompts longer than their completions most of
    the step's logits are at prompt positions, whose log-probs no objective reads. Positions of a
    window past the row's end (a row whose completion starts late) are computed, then dropped.
    """
    S = tokens_BT.shape[1] - 1
    C = min(config.completion_window, S)
    if config.prefix > 0:
        h_BTD = shared_prefix_forward(params, tokens_BT, attention_BT, config=config.model,
                                      group_size=config.group_size, prefix=config.prefix, head=False)
    else:
        h_BTD = hidden_states(params, tokens_BT, attention_BT, config=config.model)
    at_BC, inside_BC = _window(mask_BS, C)
    h_BCD = jnp.take_along_axis(h_BTD[:, :-1], at_BC[..., None], axis=1)
    targets_BC = jnp.take_along_axis(tokens_BT[:, 1:], at_BC, axis=1)
    logits_BCV = head_logits(params, h_BCD, config=config.model)
    logp_BC, entropy_BC = token_logprobs_and_entropy(logits_BCV, targets_BC, config.temperature)
    return _spread(logp_BC, at_BC, inside_BC, S), _spread(entropy_BC, at_BC, inside_BC, S)


def _window(mask_BS, C: int):
    """Each row's completion window: the ``C`` target positions ``[B, C]`` from its first
    completion target (clamped to the row), and which of them lie inside the row."""
    S = mask_BS.shape[1]
    at_BC = jnp.argmax(mask_BS, axis=1)[:, None] + jnp.arange(C)[None, :]
    return jnp.minimum(at_BC, S - 1), at_BC < S


def _spread(x_BC, at_BC, inside_BC, S: int):
    """Per-window values ``[B, C]`` at their positions of ``[B, S]`` rows, 0 elsewhere; added, not
    set: a clamped duplicate adds a zero, and its gradient is zero."""
    B = x_BC.shape[0]
    return jnp.zeros((B, S), x_BC.dtype).at[jnp.arange(B)[:, None], at_BC].add(jnp.where(inside_BC, x_BC, 0.0))


def _exact_logprobs(params, tokens_BT, attention_BT, config: StepConfig, mask_BS=None):
    """``(log-probs, entropy)`` ``[B, T-1]`` with the exact engine's bits (``exact_hidden``, its
    shared prefix with ``prefix``, then the LM head and the log-softmax row by row as the engine
    runs them: ``exact_head``, ``exact_token_logprobs``); with ``mask_BS`` and a
    ``completion_window``, at each row's window only (0 elsewhere, as :func:`_window_logprobs`)."""
    B, T = tokens_BT.shape
    S = T - 1
    model = config.model
    h_BTD = exact_hidden(params, tokens_BT, attention_BT, config=model, block=config.exact_block,
                         group_size=config.group_size if config.prefix > 0 else 1, prefix=config.prefix)
    if config.completion_window > 0 and mask_BS is not None:
        C = min(config.completion_window, S)
        at_BC, inside_BC = _window(mask_BS, C)
    else:
        C, at_BC, inside_BC = S, jnp.broadcast_to(jnp.arange(S)[None, :], (B, S)), None
    h_XD = jnp.take_along_axis(h_BTD[:, :-1], at_BC[..., None], axis=1).reshape(B * C, -1)
    targets_X = jnp.take_along_axis(tokens_BT[:, 1:], at_BC, axis=1).reshape(B * C)
    rows = padded_rows(B * C, least=exact_rows(model))
    logits_XV = exact_head(params, pad_rows(h_XD, rows), config=model)
    logp_X = exact_token_logprobs(logits_XV, pad_rows(targets_X, rows), config.temperature)[: B * C]
    _, entropy_X = token_logprobs_and_entropy(sg(logits_XV[: B * C]), targets_X, config.temperature)
    logp_BC, entropy_BC = logp_X.reshape(B, C), entropy_X.reshape(B, C)
    if inside_BC is None:
        return logp_BC, entropy_BC
    return _spread(logp_BC, at_BC, inside_BC, S), _spread(entropy_BC, at_BC, inside_BC, S)


def _token_logprobs(params, tokens_BT, attention_BT, config: StepConfig, mask_BS=None):
    """``(log-probs, entropy)`` ``[B, T-1]`` of the targets ``tokens[:, 1:]``; with ``mask_BS`` and a
    ``completion_window`` (whole-batch step), in each row's completion window only."""
    if config.exact_block > 0:
        return _exact_logprobs(params, tokens_BT, attention_BT, config, mask_BS)
    if config.logits_chunk > 0 or config.remat:
        C = config.logits_chunk if config.logits_chunk > 0 else tokens_BT.shape[1] - 1
        return _chunked_logprobs(
            params, tokens_BT, attention_BT, dataclasses.replace(config, logits_chunk=C)
        )
    if config.completion_window > 0 and mask_BS is not None:
        return _window_logprobs(params, tokens_BT, attention_BT, mask_BS, config)
    if config.prefix > 0:
        logits_BTV = shared_prefix_forward(params, tokens_BT, attention_BT, config=config.model,
                                           group_size=config.group_size, prefix=config.prefix)
    else:
        logits_BTV = forward(params, tokens_BT, attention_BT, config=config.model)
    return token_logprobs_and_entropy(logits_BTV[:, :-1], tokens_BT[:, 1:], config.temperature)


def _split(x, n: int, shards: int = 1):
    """``[B, ...]`` as ``[n, B / n, ...]``: the rows' ``shards`` equal blocks (a mesh's row shards)
    each cut into ``n`` parts, micro-batch ``i`` holding part ``i`` of every block in block order
    (with one block: rows ``i·B/n ..``). A reshape and a transpose: values move, none changes."""
    B = x.shape[0]
    parts = x.reshape((shards, n, B // (shards * n)) + x.shape[1:])
    return jnp.swapaxes(parts, 0, 1).reshape((n, B // n) + x.shape[1:])


def _merge(x, shards: int = 1):
    """The inverse of :func:`_split`: ``[n, B / n, ...]`` back to the rows' order ``[B, ...]``."""
    n, b = x.shape[:2]
    parts = x.reshape((n, shards, b // shards) + x.shape[2:])
    return jnp.swapaxes(parts, 0, 1).reshape((n * b,) + x.shape[2:])


def _batched_logprobs(params, tokens_BT, attention_BT, config: StepConfig, mask_BS=None):
    """``_token_logprobs`` one micro-batch at a time (forward only)."""
    n = config.micro_batches(tokens_BT.shape[0])
    if n == 1:
        return _token_logprobs(params, tokens_BT, attention_BT, config, mask_BS)
    def micro_batch(inputs):
        tokens_bT, attention_bT = inputs
        return _token_logprobs(params, tokens_bT, attention_bT, config)

    k = config.row_shards
    logp_NbS, entropy_NbS = jax.lax.map(
        micro_batch, (_split(tokens_BT, n, k), _split(attention_BT, n, k))
    )
    return _merge(logp_NbS, k), _merge(entropy_NbS, k)


def _unpacked(x_NS, rows_BS, mask_BS):
    """Per-target values of the packed rows ``[N, W-1]`` gathered back by sample ``[B, T-1]``: each
    sample's targets where ``mask_BS`` is True, 0 elsewhere (so no gradient flows from there)."""
    return jnp.where(mask_BS, jnp.take(x_NS.reshape(-1), rows_BS), 0.0)


def _packed(g_BS, rows_BS, mask_BS, shape_NS):
    """The per-sample cotangent ``[B, T-1]`` spread onto the packed rows' targets ``[N, W-1]``
    (the transpose of :func:`_unpacked`: every sample target has one place, so nothing is summed)."""
    flat = jnp.zeros(shape_NS[0] * shape_NS[1], g_BS.dtype)
    return flat.at[rows_BS.reshape(-1)].add(jnp.where(mask_BS, g_BS, 0.0).reshape(-1)).reshape(shape_NS)


@functools.partial(jax.jit, static_argnames=("config",))
def score(params, tokens_BT, attention_BT, mask_BS=None, rows_BS=None, *, config: StepConfig) -> jax.Array:
    """Log-probs ``[B, T-1]`` of the targets ``tokens[:, 1:]`` under ``params`` (no gradient); with
    ``mask_BS``, those the train step computes (its ``completion_window``; 0 outside it); with
    ``rows_BS``, of a packed batch's samples (``TrainBatch.rows_BS``)."""
    if rows_BS is not None:
        logp_NS, _ = _batched_logprobs(params, tokens_BT, attention_BT, config)
        return _unpacked(logp_NS, rows_BS, mask_BS)
    logp_BS, _ = _batched_logprobs(params, tokens_BT, attention_BT, config, mask_BS)
    return logp_BS


def _advantages(o: PolicyObjective, rewards_MG, logp_old_BS, logp_ref_BS, mask_BS):
    """Advantages ``[B]`` or ``[B, S]`` with the algorithm's estimator and KL-in-reward."""
    M, G = rewards_MG.shape
    if o.overlong_buffer is not None:  # DAPO's soft overlong punishment, before any advantage
        assert o.max_length is not None  # require_complete() refuses a buffer without it
        lengths_B = jnp.sum(mask_BS, axis=1)
        rewards_MG = rewards_MG + overlong_penalty(
            lengths_B, max_length=o.max_length, buffer_length=o.overlong_buffer
        ).reshape(M, G)
    kl_in_reward = o.kl_placement == "reward" and o.kl_coef > 0
    kl_BS = None
    if kl_in_reward:
        kl_BS = sg(token_kl(logp_old_BS, logp_ref_BS, o.kl_estimator, mask_BT=mask_BS))
    if o.estimator == "gae":
        penalty = None if kl_BS is None else o.kl_coef * kl_BS
        scores_B = rewards_MG.reshape(M * G)
        rewards_BS = token_rewards(scores_B, mask_BS, penalty_BT=penalty)
        # No critic in the built-in model: GAE over a zero value baseline, then whitened.
        adv_BS, _ = gae_advantages(
            rewards_BS, jnp.zeros_like(rewards_BS), mask_BS, gamma=o.gae_gamma, lam=o.gae_lambda
        )
        return whiten(adv_BS, mask_BS)
    if kl_BS is not None:
        seq_kl_B = jnp.sum(jnp.where(mask_BS, kl_BS, 0.0), axis=1)
        rewards_MG = rewards_MG - o.kl_coef * seq_kl_B.reshape(M, G)
    kwargs = {"eps": o.advantage_eps} if o.estimator == "grpo" else {}
    return group_advantages(rewards_MG, o.estimator, **kwargs).reshape(M * G)


def _preference(o, logp_BS, logp_ref_BS, mask_BS, rewards_MG):
    """DPO on (best, worst) of each group; KTO with rewards above the group mean desirable, below
    it undesirable, and rows at the mean (all of a group with equal rewards) unlabelled."""
    M, G = rewards_MG.shape
    if isinstance(o, DPOObjective):
        best_M = jnp.argmax(rewards_MG, axis=1) + jnp.arange(M) * G
        worst_M = jnp.argmin(rewards_MG, axis=1) + jnp.arange(M) * G
        has_pair_M = jnp.max(rewards_MG, axis=1) > jnp.min(rewards_MG, axis=1)
        rows = jnp.concatenate([best_M, worst_M])
        pair_mask = jnp.concatenate([has_pair_M, has_pair_M])[:, None] & mask_BS[rows]
        loss, metrics = preference_loss(
            o, logp=logp_BS[rows], logp_ref=logp_ref_BS[rows], mask=pair_mask
        )
        metrics["pairs"] = jnp.sum(has_pair_M).astype(jnp.float32)
        return loss, metrics
    mean_MG = jnp.mean(rewards_MG, axis=1, keepdims=True)
    desirable_B = (rewards_MG > mean_MG).reshape(M * G)
    # A row at its group's mean, every row of a group whose rewards are all equal among them, is
    # neither: labelling an all-correct group undesirable would push down every right answer.
    labelled_B = (rewards_MG != mean_MG).reshape(M * G)
    # Reference point z0: the batch's mean sequence KL to the reference, clipped at 0 (KTO paper).
    seq_kl_B = jnp.sum(jnp.where(mask_BS, sg(logp_BS) - logp_ref_BS, 0.0), axis=1)
    z0 = jnp.maximum(jnp.mean(seq_kl_B), 0.0)
    loss, metrics = preference_loss(
        o, logp=logp_BS, logp_ref=logp_ref_BS, mask=mask_BS & labelled_B[:, None], desirable=desirable_B,
        reference_point=z0,
    )
    metrics["labelled"] = jnp.sum(labelled_B).astype(jnp.float32)
    return loss, metrics


def _bounded_grads(params, tokens_BT, attention_BT, cotangent_BS, config: StepConfig):
    """``Σ g ∇θ ℓ`` over the rows, one micro-batch at a time (``accumulate``: the LM head in
    chunks, the layers rematerialised with ``remat``); with one micro-batch and no memory bound,
    plain autodiff of the log-probs."""
    n = config.micro_batches(tokens_BT.shape[0])
    if n == 1 and config.logits_chunk <= 0 and not config.remat:
        _, vjp = jax.vjp(lambda q: _token_logprobs(q, tokens_BT, attention_BT, config)[0], params)
        (g,) = vjp(cotangent_BS)
        return g
    chunk = config.logits_chunk if config.logits_chunk > 0 else tokens_BT.shape[1] - 1

    def step_micro_batch(grads, inputs):
        tokens_bT, attention_bT, cotangent_bS = inputs
        grads = accumulate(
            grads, params, tokens_bT, attention_bT, cotangent_bS, config=config.model,
            chunk=chunk, temperature=config.temperature, remat=config.remat,
        )
        return grads, None

    k = config.row_shards
    micro_batches = (_split(tokens_BT, n, k), _split(attention_BT, n, k), _split(cotangent_BS, n, k))
    # The zero gradient, made from 0·g (no constant to XLA: NaN for an infinite g) so that
    # it is only allocated once the first pass is done, not beside it.
    zero = cotangent_BS.reshape(-1)[0] * 0
    grads, _ = jax.lax.scan(
        step_micro_batch, jax.tree.map(lambda p: jnp.zeros_like(p) + zero.astype(p.dtype), params), micro_batches,
    )
    return grads


def _fixed_order_grads(params, batch: TrainBatch, objective, config: StepConfig):
    """``(loss, metrics, grads)`` with the gradient summed over the mesh's row shards in a fixed
    order, whatever the devices' layout over processes.

    Each device computes its rows' log-probs with the whole parameters (gathered: an all-gather
    moves bits, it does not round), the objective's cotangent ``∂L/∂ℓ`` is taken over the whole
    batch, and each device then computes its rows' gradient ``Σ g ∇θ ℓ``; the row shards'
    gradients are all-gathered and summed in shard order on every device. A psum's order is the
    collective's (XLA:CPU's in one process, gloo's across processes: they differ for more than
    two devices); this sum's is the program's, so 1 process × 4 devices, 2 × 2 and 4 × 1 give the
    same bits. It costs a second forward pass and the whole gradient on every device.
    """
    from jax.sharding import PartitionSpec as P

    from runtime.trainer.mesh import ROWS

    mesh = config.fixed_order_mesh
    rows, whole = P(ROWS), P()
    # Each device's rows, micro-batched as the whole batch would be: the same number of
    # micro-batches, each of its share of the rows.
    local = dataclasses.replace(config, fixed_order_mesh=None, row_shards=1,
                                micro_batch_size=config.micro_batch_size // config.row_shards)

    def local_logprobs(p, tokens_bT, attention_bT):
        return _batched_logprobs(p, tokens_bT, attention_bT, local)

    logp_BS, entropy_BS = jax.shard_map(
        local_logprobs, mesh=mesh, in_specs=(whole, rows, rows), out_specs=(rows, rows), check_vma=False,
    )(sg(params), batch.tokens_BT, batch.attention_BT)
    (loss, metrics), cotangent_BS = jax.value_and_grad(objective, has_aux=True)(logp_BS, entropy_BS)

    def local_grads(p, tokens_bT, attention_bT, cotangent_bS):
        g = _bounded_grads(p, tokens_bT, attention_bT, cotangent_bS, local)
        return jax.tree.map(lambda x: jnp.sum(jax.lax.all_gather(x, ROWS), axis=0), g)

    grads = jax.shard_map(
        local_grads, mesh=mesh, in_specs=(whole, rows, rows, rows), out_specs=whole, check_vma=False,
    )(params, batch.tokens_BT, batch.attention_BT, cotangent_BS)
    return loss, metrics, grads


@functools.partial(jax.jit, static_argnames=("config",), donate_argnames=("params", "opt_state"))
def train_step(
    params, opt_state, batch: TrainBatch, logp_old_BS, logp_ref_BS, current_B, *, config: StepConfig
):
    """One optimizer step on one batch. DONATES params, opt_state.

    Args:
      params: the policy's parameters (version ``s - 1``).
      opt_state: the optimizer state that goes with them.
      batch: the packed batch, as device arrays (``jax.device_put`` of :func:`pack`'s result).
      logp_old_BS: recomputed old log-probs of rows not sampled from ``params`` (ignored on
        ``current_B`` rows).
      logp_ref_BS: reference-model log-probs (zeros when the objective needs none).
      current_B: True on rows sampled from ``params`` itself.
      config: static step configuration.

    Returns:
      ``(params, opt_state, metrics)`` with scalar float32 metrics.
    """
    o = config.objective
    mask_BS = batch.mask_BS
    behaviour_BS = batch.behaviour_BS

    def objective(logp_BS, entropy_BS):
        old_BS = jnp.where(current_B[:, None], sg(logp_BS), logp_old_BS)
        if isinstance(o, PolicyObjective):
            advantages = _advantages(o, batch.rewards_MG, old_BS, logp_ref_BS, mask_BS)
            loss, metrics = policy_loss(
                o, logp=logp_BS, logp_old=old_BS, logp_ref=logp_ref_BS,
                advantages=advantages, mask=mask_BS, logp_behaviour=behaviour_BS,
            )
        else:
            loss, metrics = _preference(o, logp_BS, logp_ref_BS, mask_BS, batch.rewards_MG)
        delta_BS = jnp.abs(old_BS - behaviour_BS)
        # Rows whose old log-probs the trainer computed; with "behaviour", older rows' are the
        # engine's own, so only on-policy rows measure the mismatch.
        measured_BS = mask_BS if config.old_logprobs == "recompute" else mask_BS & current_B[:, None]
        metrics = dict(metrics)
        metrics.update(
            entropy=masked_mean(sg(entropy_BS), mask_BS),
            kl_ref=masked_mean(token_kl(sg(logp_BS), logp_ref_BS, "k3", mask_BT=mask_BS), mask_BS)
            if config.needs_reference else jnp.zeros((), jnp.float32),
            logprob_mismatch_max=jnp.max(jnp.where(measured_BS, delta_BS, 0.0)),
            logprob_mismatch_mean=masked_mean(delta_BS, measured_BS),
        )
        return loss, metrics

    n = config.micro_batches(batch.size)
    rows_BS = batch.rows_BS

    def by_sample(logp, entropy):  # a packed batch's per-target values, gathered back by sample
        if rows_BS is None:
            return logp, entropy
        return _unpacked(logp, rows_BS, mask_BS), _unpacked(entropy, rows_BS, mask_BS)

    if config.fixed_order_mesh is not None:
        loss, metrics, grads = _fixed_order_grads(params, batch, objective, config)
    elif n == 1:
        def loss_fn(p):
            window = None if rows_BS is not None else batch.mask_BS
            return objective(*by_sample(*_token_logprobs(p, batch.tokens_BT, batch.attention_BT, config, window)))

        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    else:
        logp, entropy = _batched_logprobs(sg(params), batch.tokens_BT, batch.attention_BT, config)
        (loss, metrics), cotangent_BS = jax.value_and_grad(objective, has_aux=True)(*by_sample(logp, entropy))
        if rows_BS is not None:
            cotangent_BS = _packed(cotangent_BS, rows_BS, mask_BS, logp.shape)
        grads = _bounded_grads(params, batch.tokens_BT, batch.attention_BT, cotangent_BS, config)
    if n == 1:
        updates, opt_state = make_optimizer(config).update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    else:
        params, opt_state = update_leaf_by_leaf(grads, opt_state, params, config.optimizer)
    metrics.update(
        loss=loss,
        grad_norm=optax.tree.norm(grads),
        reward_mean=jnp.mean(batch.rewards_MG),
        response_tokens=jnp.sum(mask_BS).astype(jnp.float32) / mask_BS.shape[0],
    )
    return params, opt_state, {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}


@jax.jit
def finite_leaves(tree) -> jax.Array:
    """``bool[L]``: whether each leaf of ``tree`` (in ``jax.tree.leaves`` order) holds only
    finite values; the trainer publishes no version with a NaN or an infinity in it."""
    return jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(tree)])
