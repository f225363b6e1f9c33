"""Packing rollouts into the fixed-shape arrays of a train step (numpy; JAX only sees the result).

A batch holds ``B = M·G`` rows — ``M`` groups of ``G`` completions of one prompt each, in
training order (rollout-id order in deterministic mode). Row ``b`` is the prompt followed by the
completion, right-padded to the fixed width ``T``; targets are ``tokens[:, 1:]``, so the
log-prob of the token at position ``t + 1`` comes from the logits at ``t``. Fixed shapes mean one
compiled step for the whole run, and make a step a pure function of its inputs.

``TrainBatch`` is a registered pytree: :func:`pack` builds it with numpy arrays on the host,
``jax.device_put`` moves it whole, and the jitted step takes it as one argument.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

import jax
import numpy as np

from runtime.errors import RlxError


@dataclasses.dataclass(frozen=True)
class Sample:
    """One rollout as the trainer sees it."""

    prompt: np.ndarray  # int32 prompt token ids (with BOS)
    completion: np.ndarray  # int32 sampled token ids
    logprobs: np.ndarray  # float32 behaviour log-probs of the completion tokens
    reward: float
    policy_version: int
    mask: np.ndarray | None = None  # bool over the completion: the ids trained (None: all; a multi-turn
    # episode's sampled ids, not the ids its environment appended)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainBatch:
    """Arrays of one train step: numpy from :func:`pack`, device arrays inside the step.

    Attributes:
      tokens_BT: int32 prompt + completion, right-padded with ``pad_id``.
      attention_BT: bool, True on real tokens.
      mask_BS: bool ``[B, T-1]``, True where target ``tokens[:, 1:]`` is a completion token (of a
        multi-turn episode: one the model sampled, not one its environment appended).
      behaviour_BS: float32 ``[B, T-1]`` the engine's log-probs of those targets (0 elsewhere).
      rewards_MG: float32 ``[M, G]`` sequence rewards by group.
      versions_B: int32 policy version each row was sampled from.
      rows_BS: packed batches only (:func:`pack_bins`): int32 ``[B, T-1]``, where each row's
        target lies among the packed rows' targets (flattened ``[N·(W-1)]``); ``tokens_BT`` and
        ``attention_BT`` are then the ``N`` packed rows (``attention_BT`` their int32 segment ids,
        0 on padding), and every other field stays by row. None for a padded batch.
    """

    tokens_BT: np.ndarray | jax.Array
    attention_BT: np.ndarray | jax.Array
    mask_BS: np.ndarray | jax.Array
    behaviour_BS: np.ndarray | jax.Array
    rewards_MG: np.ndarray | jax.Array
    versions_B: np.ndarray | jax.Array
    rows_BS: np.ndarray | jax.Array | None = None

    @property
    def size(self) -> int:
        """Rows of the step's forward: the packed rows of a packed batch."""
        return int(self.tokens_BT.shape[0])

    def digest(self) -> str:
        """sha256 over every array's dtype, shape and bytes, in field order (a padded batch's
        absent ``rows_BS`` adds nothing: its digest is what it was before packing existed)."""
        h = hashlib.sha256()
        for f in dataclasses.fields(self):
            if getattr(self, f.name) is None:
                continue
            a = np.ascontiguousarray(getattr(self, f.name))
            h.update(f"{f.name}:{a.dtype.str}:{a.shape};".encode())
            h.update(a.tobytes())
        return h.hexdigest()


# Above this many tokens a shared prefix is rounded down to one of a few lengths per octave, so
# that a run whose prompts vary compiles its step for a handful of prefix lengths, not one per
# shortest prompt.
EXACT_PREFIX_TOKENS = 16


def shared_prefix(samples: Sequence[Sample], group_size: int, per_octave: int = 1) -> int:
    """How many leading tokens every row of each group shares, for a step that computes them once
    per group: the batch's shortest prompt, past ``EXACT_PREFIX_TOKENS`` rounded down to one of
    ``per_octave`` (a power of two) evenly spaced lengths from a power of two to the next (1: the
    power of two; 8: a multiple of 4 from 32 to 64, 46 -> 44); 0 where a group's rows do not start
    with the same prompt."""
    for start in range(0, len(samples), group_size):
        first = samples[start].prompt
        if any(not np.array_equal(s.prompt, first) for s in samples[start + 1 : start + group_size]):
            return 0
    shortest = min(len(s.prompt) for s in samples)
    if shortest <= EXACT_PREFIX_TOKENS:
        return shortest
    spacing = max(1, (1 << (shortest.bit_length() - 1)) // per_octave)
    return shortest - shortest % spacing


def pack(samples: Sequence[Sample], *, group_size: int, width: int, pad_id: int, window: int = 0) -> TrainBatch:
    """Pack ``samples`` (whole groups, in order) into a ``TrainBatch`` of width ``width``; with a
    ``window`` (the step's ``completion_window``), no completion may be longer than it."""
    if not samples or len(samples) % group_size:
        raise RlxError(f"a batch needs whole groups of {group_size}; got {len(samples)} samples")
    B = len(samples)
    tokens = np.full((B, width), pad_id, np.int32)
    attention = np.zeros((B, width), bool)
    mask = np.zeros((B, width - 1), bool)
    behaviour = np.zeros((B, width - 1), np.float32)
    for b, s in enumerate(samples):
        p, c = len(s.prompt), len(s.completion)
        if p < 1 or p + c > width:
            raise RlxError(f"row {b}: prompt {p} + completion {c} tokens do not fit width {width}")
        if 0 < window < c:
            raise RlxError(f"row {b}: a completion of {c} tokens is longer than the train step's completion window "
                           f"of {window} (sampling.max_tokens)")
        if len(s.logprobs) != c:
            raise RlxError(f"row {b}: {c} completion tokens but {len(s.logprobs)} log-probs")
        tokens[b, :p] = s.prompt
        tokens[b, p : p + c] = s.completion
        attention[b, : p + c] = True
        if s.mask is None:
            mask[b, p - 1 : p - 1 + c] = True
        elif len(s.mask) != c:
            raise RlxError(f"row {b}: {c} completion tokens but a mask of {len(s.mask)}")
        else:
            mask[b, p - 1 : p - 1 + c] = s.mask
        behaviour[b, p - 1 : p - 1 + c] = s.logprobs
    rewards = np.asarray([s.reward for s in samples], np.float32).reshape(-1, group_size)
    versions = np.asarray([s.policy_version for s in samples], np.int32)
    return TrainBatch(tokens, attention, mask, behaviour, rewards, versions)


def pack_bins(samples: Sequence[Sample], *, group_size: int, width: int, pad_id: int, multiple: int = 1,
              align: int = 1) -> TrainBatch:
    """``samples`` packed into rows of ``width`` tokens, several sequences to a row.

    First fit by decreasing length (ties by sample order, so the packing is a pure function of the
    samples): each sequence (prompt + completion) goes into the first row with room for it. Each
    row's sequences are numbered 1, 2, … in ``attention_BT`` (0 on padding), so that the model
    gives each its own positions from 0 and lets it attend only within itself: its tokens get the
    log-probs a padded row of their own would give, up to the rounding of matmuls of other shapes.
    The number of rows is rounded up to a multiple of ``multiple`` (empty rows are padding), so that
    batches of similar lengths share one compiled step. ``mask_BS``, ``behaviour_BS``, the rewards
    and versions stay by sample, in the padded layout of width ``width``; ``rows_BS`` says where
    each sample's targets are among the packed rows'.
    With ``align > 1`` every sequence starts at a multiple of ``align`` tokens of its row (the
    exact log-probs' pages: a sequence's keys then fall into the blocks the engine's pages held).
    """
    padded = pack(samples, group_size=group_size, width=width, pad_id=pad_id)
    lengths = [len(s.prompt) + len(s.completion) for s in samples]
    rows: list[list[int]] = []  # sample indices per packed row
    room: list[int] = []
    for i in sorted(range(len(samples)), key=lambda i: (-lengths[i], i)):
        at = next((r for r, free in enumerate(room) if free >= lengths[i]), None)
        if at is None:
            rows.append([])
            room.append(width)
            at = len(rows) - 1
        rows[at].append(i)
        room[at] = max(0, room[at] - -(-lengths[i] // align) * align)
    N = -(-len(rows) // multiple) * multiple
    tokens = np.full((N, width), pad_id, np.int32)
    segments = np.zeros((N, width), np.int32)
    where = np.zeros(padded.mask_BS.shape, np.int32)
    S = width - 1
    for n, members in enumerate(rows):
        offset = 0
        for k, i in enumerate(members, 1):
            L = lengths[i]
            tokens[n, offset:offset + L] = padded.tokens_BT[i, :L]
            segments[n, offset:offset + L] = k
            where[i, : L - 1] = n * S + offset + np.arange(L - 1)
            offset += -(-L // align) * align
    return dataclasses.replace(padded, tokens_BT=tokens, attention_BT=segments, rows_BS=where)
