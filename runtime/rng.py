"""Named random streams: every key is a pure function of (run seed, purpose, indices).

Nothing here keeps state or reads the global RNG, the clock or the environment, so the same
(seed, purpose, indices) gives the same key in every process, on every platform, after every
restart: a key never depends on which process asks, or when. The derivation is a keyed hash::

    key(seed, purpose, i_1, …, i_n) = BLAKE2b-128(u64(seed) ‖ u32(len(purpose)) ‖ purpose
                                                   ‖ i64(i_1) ‖ … ‖ i64(i_n))

read as two little-endian u64 words. Distinct purposes or index tuples give independent keys
(up to hash collisions); the framing (lengths, fixed-width indices) keeps different inputs from
hashing the same bytes. The controller uses only this module and numpy, never JAX; the engine
turns a rollout's seed into a JAX key itself (``runtime.inference.sampling``).

Purposes used by the run:

- :data:`SHUFFLE` (data epoch): the permutation of the training set for one pass over it.
- :data:`RESAMPLE` (batch, ordinal): the prompt of a group drawn to replace a filtered one.
- :data:`ROLLOUT` (batch, ordinal, sample): the sampling seed of one rollout.
- :data:`MODEL_INIT` (): the initial weights of the built-in model.
- :data:`WARM_START` (): the problems of the supervised warm start's batches.
- :data:`EVAL_SPLIT` (dataset size): which problems of a task are held out for evaluation.
- :data:`CODE_FUNCTIONS` (functions): which functions of the program-synthesis task are held out.
- :data:`CODE_PROBLEM` (held out, index): one generated program-synthesis problem.
- :data:`GYM_EVAL` (): the seed of a reasoning-gym task's held-out generator.
- :data:`GYM_TRAIN` (draw): the seed of a reasoning-gym task's training generator ``draw``
  (``runtime.tasks.gym``).
- :data:`EVAL_SAMPLE` (version, problem, sample): the sampling seed of one held-out evaluation
  completion (``runtime.evaluation``).
- :data:`EPISODE_TURN` (turn), seeded with the rollout's seed: the sampling seed of one turn of a
  multi-turn episode (``runtime.episodes``).
"""

from __future__ import annotations

import functools
import hashlib
import struct

import numpy as np

from runtime.errors import UsageError

SHUFFLE = "data.shuffle"
RESAMPLE = "data.resample"
ROLLOUT = "rollout.seed"
MODEL_INIT = "model.init"
WARM_START = "pretrain.batches"
EVAL_SPLIT = "data.eval_split"
CODE_FUNCTIONS = "codefn.eval_functions"
CODE_PROBLEM = "codefn.problem"
GYM_EVAL = "gym.eval"
GYM_TRAIN = "gym.train"
EVAL_SAMPLE = "eval.sample"
EPISODE_TURN = "episode.turn"

SEED_BITS = 63
_SEED_MASK = (1 << SEED_BITS) - 1
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
        raise UsageError(f"seed {seed!r} is not accepted; a run seed is an integer in [0, 2**64)")
    return int(seed)


def _message(seed: int, purpose: str, indices: tuple[int, ...]) -> bytes:
    p = purpose.encode("utf-8")
    try:
        tail = struct.pack(f"<{len(indices)}q", *indices)
    except struct.error:
        raise UsageError(
            f"stream indices {indices!r} are not accepted; indices are integers in [-2**63, 2**63)"
        ) from None
    return _U64.pack(_check_seed(seed)) + _U32.pack(len(p)) + p + tail


def key(seed: int, purpose: str, *indices: int) -> tuple[int, int]:
    """The 128-bit key of stream ``purpose`` at ``indices`` as two u64 words."""
    digest = hashlib.blake2b(_message(seed, purpose, indices), digest_size=16).digest()
    return _U64.unpack_from(digest, 0)[0], _U64.unpack_from(digest, 8)[0]


def derive_seed(seed: int, purpose: str, *indices: int) -> int:
    """A 63-bit seed for stream ``purpose`` at ``indices`` (fits a signed int64 column)."""
    return key(seed, purpose, *indices)[0] & _SEED_MASK


def generator(seed: int, purpose: str, *indices: int) -> np.random.Generator:
    """A numpy Philox generator keyed by ``key(seed, purpose, *indices)``.

    Philox is counter-based: its output is defined by the key alone, with no hidden state
    shared between streams.
    """
    lo, hi = key(seed, purpose, *indices)
    return np.random.Generator(np.random.Philox(key=np.array([lo, hi], dtype=np.uint64)))


@functools.lru_cache(maxsize=8)
def _permutation(seed: int, data_epoch: int, size: int) -> np.ndarray:
    perm = generator(seed, SHUFFLE, data_epoch).permutation(size)
    perm.setflags(write=False)
    return perm


def epoch_permutation(seed: int, data_epoch: int, size: int) -> np.ndarray:
    """The order in which pass ``data_epoch`` visits a dataset of ``size`` items (read-only)."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise UsageError(f"dataset size {size!r} is not accepted; it must be an integer >= 1")
    return _permutation(_check_seed(seed), int(data_epoch), size)


def stream_prompt(seed: int, size: int, position: int) -> tuple[int, int]:
    """``(data_epoch, dataset index)`` at ``position`` of the run's prompt stream.

    The stream visits the dataset once per epoch, each epoch in its own seeded order.
    """
    data_epoch, offset = divmod(int(position), size)
    return data_epoch, int(epoch_permutation(seed, data_epoch, size)[offset])


def resample_prompt(seed: int, size: int, batch: int, ordinal: int) -> int:
    """The dataset index of a resampled group (``ordinal``) of ``batch``, uniform over the data."""
    return int(derive_seed(seed, RESAMPLE, batch, ordinal) % size)


def rollout_seed(seed: int, batch: int, ordinal: int, sample: int) -> int:
    """The sampling seed of sample ``sample`` of group ``ordinal`` of ``batch``."""
    return derive_seed(seed, ROLLOUT, batch, ordinal, sample)


_I64 = struct.Struct("<q")


def rollout_seeds(seed: int, batch: int, ordinal: int, count: int) -> tuple[int, ...]:
    """``rollout_seed`` of samples ``0 .. count-1`` of a group: the shared part of the key's
    message is built once."""
    head = _message(seed, ROLLOUT, (batch, ordinal))
    out = []
    for sample in range(count):
        digest = hashlib.blake2b(head + _I64.pack(sample), digest_size=16).digest()
        out.append(_U64.unpack_from(digest, 0)[0] & _SEED_MASK)
    return tuple(out)
