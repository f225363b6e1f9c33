"""Packing rollouts into a ``TrainBatch``: layout, masks, group order, edge lengths, errors, and
the batch as one pytree argument of a jitted function."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from runtime.errors import RlxError
from runtime.trainer import Sample, TrainBatch, pack, pack_bins

PAD = 0


def sample(prompt, completion, logprobs=None, reward=0.0, version=0) -> Sample:
    if logprobs is None:
        logprobs = [-0.5 - 0.25 * i for i in range(len(completion))]
    return Sample(
        prompt=np.asarray(prompt, np.int32),
        completion=np.asarray(completion, np.int32),
        logprobs=np.asarray(logprobs, np.float32),
        reward=float(reward),
        policy_version=version,
    )


def test_one_row_layout_written_out():
    # prompt [1, 5] + completion [7, 8, 2] in width 6: tokens 1 5 7 8 2 PAD. Targets are
    # tokens[1:] = 5 7 8 2 PAD; the completion tokens 7 8 2 are targets 1..3, predicted from the
    # logits at positions 1..3 (the last prompt token onwards).
    b = pack([sample([1, 5], [7, 8, 2], [-0.1, -0.2, -0.3], reward=0.5, version=3)],
             group_size=1, width=6, pad_id=PAD)
    np.testing.assert_array_equal(b.tokens_BT, [[1, 5, 7, 8, 2, PAD]])
    np.testing.assert_array_equal(b.attention_BT, [[1, 1, 1, 1, 1, 0]])
    np.testing.assert_array_equal(b.mask_BS, [[0, 1, 1, 1, 0]])
    np.testing.assert_array_equal(b.behaviour_BS, np.float32([[0, -0.1, -0.2, -0.3, 0]]))
    np.testing.assert_array_equal(b.rewards_MG, np.float32([[0.5]]))
    np.testing.assert_array_equal(b.versions_B, [3])
    assert [(f.name, getattr(b, f.name).dtype) for f in dataclasses.fields(b) if f.name != "rows_BS"] == [
        ("tokens_BT", np.int32), ("attention_BT", bool), ("mask_BS", bool),
        ("behaviour_BS", np.float32), ("rewards_MG", np.float32), ("versions_B", np.int32),
    ]
    assert b.rows_BS is None  # a padded batch: each row its own sample


def test_edge_lengths_one_token_and_full_width():
    width = 5
    b = pack([
        sample([1], [9]),  # length-1 completion after a length-1 prompt
        sample([1, 4], [6, 7, 8]),  # prompt + completion fill the row exactly
        sample([1, 2, 3, 4], [5]),  # longest prompt, one completion token in the last column
        sample([1, 2, 3], []),  # an empty completion: a row that enters no loss
    ], group_size=2, width=width, pad_id=PAD)
    np.testing.assert_array_equal(b.tokens_BT, [
        [1, 9, PAD, PAD, PAD], [1, 4, 6, 7, 8], [1, 2, 3, 4, 5], [1, 2, 3, PAD, PAD],
    ])
    np.testing.assert_array_equal(b.mask_BS.astype(int), [
        [1, 0, 0, 0], [0, 1, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0],
    ])
    np.testing.assert_array_equal(b.attention_BT.sum(axis=1), [2, 5, 5, 3])
    # Behaviour log-probs sit exactly on the mask, zero elsewhere.
    assert np.all((b.behaviour_BS != 0) == b.mask_BS)
    np.testing.assert_array_equal(b.behaviour_BS[1, 1:], np.float32([-0.5, -0.75, -1.0]))


def test_rows_and_groups_keep_the_given_order():
    # Six rollouts, groups of 3, given in training (rollout-id) order: row b is sample b and
    # group m is rows 3m..3m+2, so rewards_MG[m, g] is the reward of sample 3m + g.
    rewards = [0.0, 1.0, 0.25, 0.5, 0.75, 2.0]
    samples = [sample([1, 10 + i], [20 + i], reward=r, version=i % 2) for i, r in enumerate(rewards)]
    b = pack(samples, group_size=3, width=4, pad_id=PAD)
    np.testing.assert_array_equal(b.tokens_BT[:, 1], 10 + np.arange(6))
    np.testing.assert_array_equal(b.rewards_MG, np.float32(rewards).reshape(2, 3))
    np.testing.assert_array_equal(b.versions_B, [0, 1, 0, 1, 0, 1])
    # Another order is another batch: the digest is a digest of the order too.
    swapped = pack(samples[1:2] + samples[:1] + samples[2:], group_size=3, width=4, pad_id=PAD)
    assert swapped.digest() != b.digest()
    assert pack(samples, group_size=3, width=4, pad_id=PAD).digest() == b.digest()


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(TrainBatch)])
def test_digest_covers_every_field(field):
    samples = [sample([1, 2], [3, 4], reward=1.0), sample([1], [5], reward=0.0)]
    b = (pack_bins if field == "rows_BS" else pack)(samples, group_size=2, width=5, pad_id=PAD)
    a = getattr(b, field).copy()
    a.reshape(-1)[-1] = a.reshape(-1)[-1] + 1 if a.dtype != bool else ~a.reshape(-1)[-1]
    assert dataclasses.replace(b, **{field: a}).digest() != b.digest()


@pytest.mark.parametrize(("samples", "message"), [
    ([], "a batch needs whole groups of 2; got 0 samples"),
    ([sample([1], [2])] * 3, "a batch needs whole groups of 2; got 3 samples"),
    ([sample([1, 2, 3], [4, 5, 6])] * 2, "row 0: prompt 3 + completion 3 tokens do not fit width 5"),
    ([sample([], [4])] * 2, "row 0: prompt 0 + completion 1 tokens do not fit width 5"),
    ([sample([1], [2]), sample([1], [2, 3], [-1.0])], "row 1: 2 completion tokens but 1 log-probs"),
])
def test_bad_batches_are_rejected_with_the_value(samples, message):
    with pytest.raises(RlxError) as info:
        pack(samples, group_size=2, width=5, pad_id=PAD)
    assert str(info.value) == message


def test_the_batch_is_one_pytree_argument():
    b = pack([sample([1, 2], [3, 4], reward=1.0), sample([1], [5], reward=0.0)],
             group_size=2, width=5, pad_id=PAD)
    leaves = jax.tree.leaves(b)
    assert [leaf.shape for leaf in leaves] == [(2, 5), (2, 5), (2, 4), (2, 4), (1, 2), (2,)]
    on_device = jax.device_put(b)
    assert isinstance(on_device, TrainBatch) and isinstance(on_device.mask_BS, jax.Array)
    assert on_device.digest() == b.digest()  # same dtypes, shapes and bytes

    @jax.jit
    def masked_behaviour_sum(batch: TrainBatch) -> jax.Array:
        return jnp.sum(jnp.where(batch.mask_BS, batch.behaviour_BS, 0.0))

    # -0.5 - 0.75 (row 0) - 0.5 (row 1)
    assert float(masked_behaviour_sum(on_device)) == pytest.approx(-1.75)
