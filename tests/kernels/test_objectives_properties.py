"""Invariants of the unified policy objective (spec §7: P-U1, P1-P4, P7, P9, P11, P12, P14).

Random batches have one shape (B = 8 rows in 2 groups of 4, T = 6) with random lengths (empty
rows included), log-probs, advantages and NaN/Inf garbage in every padded slot; float64.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.advantages import group_advantages
from kernels.aggregation import batch_totals
from kernels.objectives import policy_loss
from kernels.value_loss import value_loss

EXAMPLES = settings(max_examples=max(6, settings.default.max_examples // 12))
ROWS, WIDTH, GROUP = 8, 6, 4
sg = jax.lax.stop_gradient


@pytest.fixture(autouse=True)
def _float64():
    with jax.enable_x64(True):
        yield


@st.composite
def batches(draw, spread=0.6, min_length=0, token_advantages=None):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lengths = rng.integers(min_length, WIDTH + 1, size=ROWS)
    mask = np.arange(WIDTH)[None, :] < lengths[:, None]
    logp_old = -rng.uniform(0.05, 3.0, (ROWS, WIDTH))
    logp = logp_old + rng.uniform(-spread, spread, (ROWS, WIDTH))
    logp_ref = logp_old + rng.normal(0.0, 0.3, (ROWS, WIDTH))
    per_token = draw(st.booleans()) if token_advantages is None else token_advantages
    advantages = rng.normal(size=(ROWS, WIDTH) if per_token else ROWS)
    garbage = rng.choice([np.nan, np.inf, -np.inf], size=(ROWS, WIDTH))
    dirty = lambda x: np.where(mask, x, garbage)  # noqa: E731
    return dict(
        mask=mask,
        clean=dict(logp=np.where(mask, logp, 0.0), logp_old=np.where(mask, logp_old, 0.0),
                   logp_ref=np.where(mask, logp_ref, 0.0), advantages=advantages),
        dirty=dict(logp=dirty(logp), logp_old=dirty(logp_old), logp_ref=dirty(logp_ref),
                   advantages=dirty(advantages) if per_token else advantages),
    )


def kernel(algorithm, batch, logp=None, **options):
    """``(loss, grad)`` of policy_loss on the garbage-padded arrays.

    Eager on purpose: with one batch shape the primitives compile once for the whole module,
    while jitting would compile once per drawn configuration.
    """
    arrays = dict(batch["dirty"])
    if logp is not None:
        arrays["logp"] = np.where(batch["mask"], logp, np.nan)

    def fn(logp_BT):
        loss, _ = policy_loss(algorithm, **{**arrays, "logp": logp_BT}, mask=batch["mask"],
                              **options)
        return loss

    loss, grad = jax.value_and_grad(fn)(jnp.asarray(arrays["logp"]))
    assert np.isfinite(loss) and np.all(np.isfinite(grad))
    return float(loss), np.asarray(grad)


# --- slow, obvious references: the loss formulas of spec §6, differentiated by autodiff --------


def reference_row_scale(mask, mode, max_length=None, group_size=GROUP):
    """The aggregation weight of every row, written out from the formulas of spec §3."""
    lengths = mask.sum(axis=1)
    n_seq = (lengths > 0).sum()
    group_tokens = [lengths[g:g + group_size].sum() for g in range(0, len(lengths), group_size)]
    n_groups = sum(tokens > 0 for tokens in group_tokens)
    scale = np.zeros(len(lengths))
    for i, length in enumerate(lengths):
        if length == 0:
            continue
        scale[i] = {
            "seq_mean_token_mean": lambda: 1 / (n_seq * length),  # noqa: B023
            "batch_token_mean": lambda: 1 / lengths.sum(),
            "seq_mean_token_sum": lambda: 1 / n_seq,
            "max_length_mean": lambda: 1 / (n_seq * max_length),
            "group_token_mean": lambda: 1 / (n_groups * group_tokens[i // group_size]),  # noqa: B023
        }[mode]()
    return scale


def reference_aggregate(loss_BT, mask, mode, max_length=None):
    row_sums = jnp.sum(jnp.where(mask, loss_BT, 0.0), axis=1)
    return jnp.sum(row_sums * reference_row_scale(mask, mode, max_length))


def ppo_clip_terms(ratio, advantages, low, high, dual=None):
    """``max(-A r, -A clip(r, 1-ε_l, 1+ε_h))``, then ``min(·, -A c)`` where ``A < 0``."""
    loss = jnp.maximum(-advantages * ratio, -advantages * jnp.clip(ratio, 1 - low, 1 + high))
    if dual is not None:
        loss = jnp.where(advantages < 0, jnp.minimum(loss, -advantages * dual), loss)
    return loss


def k3(logp, logp_ref):
    d = logp_ref - logp
    return jnp.exp(d) - d - 1


def reference_token_clip(clean, mask, logp, *, mode, low=0.2, high=0.2, dual=None, beta=0.0,
                         max_length=None):
    advantages = jnp.broadcast_to(jnp.reshape(clean["advantages"], (ROWS, -1)), mask.shape)
    ratio = jnp.exp(logp - clean["logp_old"])
    loss = ppo_clip_terms(ratio, advantages, low, high, dual) + beta * k3(logp, clean["logp_ref"])
    return reference_aggregate(loss, mask, mode, max_length)


def sequence_advantages(clean, mask):
    advantages = np.broadcast_to(np.reshape(clean["advantages"], (ROWS, -1)), mask.shape)
    return np.where(mask, advantages, 0.0).sum(1) / np.maximum(mask.sum(1), 1)


def reference_gspo(clean, mask, logp, *, low, high):
    lengths = np.maximum(mask.sum(axis=1), 1).astype(np.float64)
    log_s = jnp.sum(jnp.where(mask, logp - clean["logp_old"], 0.0), axis=1) / lengths
    advantages = sequence_advantages(clean, mask)
    per_sequence = ppo_clip_terms(jnp.exp(log_s), advantages, low, high)
    return jnp.sum(jnp.where(mask.any(axis=1), per_sequence, 0.0)) / float(mask.any(axis=1).sum())


def reference_gspo_token(clean, mask, logp, *, low, high):
    lengths = np.maximum(mask.sum(axis=1), 1).astype(np.float64)
    log_s = jnp.sum(jnp.where(mask, logp - clean["logp_old"], 0.0), axis=1) / lengths
    log_s_token = sg(log_s)[:, None] + logp - sg(logp)
    advantages = jnp.broadcast_to(jnp.reshape(clean["advantages"], (ROWS, -1)), mask.shape)
    loss = ppo_clip_terms(jnp.exp(log_s_token), advantages, low, high)
    return reference_aggregate(loss, mask, "seq_mean_token_mean")


def reference_cispo(clean, mask, logp, *, high):
    advantages = jnp.broadcast_to(jnp.reshape(clean["advantages"], (ROWS, -1)), mask.shape)
    weight = sg(jnp.minimum(jnp.exp(logp - clean["logp_old"]), 1 + high))
    return reference_aggregate(-weight * advantages * logp, mask, "batch_token_mean")


def reference_reinforce(clean, mask, logp, *, mode):
    advantages = jnp.broadcast_to(jnp.reshape(clean["advantages"], (ROWS, -1)), mask.shape)
    return reference_aggregate(-advantages * logp, mask, mode)


def reference_rloo_trl(clean, mask, logp):
    log_rho = jnp.sum(jnp.where(mask, logp - clean["logp_old"], 0.0), axis=1)
    per_sequence = ppo_clip_terms(jnp.exp(log_rho), sequence_advantages(clean, mask), 0.2, 0.2)
    return jnp.sum(jnp.where(mask.any(axis=1), per_sequence, 0.0)) / float(mask.any(axis=1).sum())


CASES = {
    "reinforce": (dict(), functools.partial(reference_reinforce, mode="seq_mean_token_sum")),
    "rloo": (dict(), functools.partial(reference_reinforce, mode="seq_mean_token_sum")),
    "grpo": (dict(), functools.partial(reference_token_clip, mode="seq_mean_token_mean")),
    "grpo_kl": (dict(kl_coef=0.04),
                functools.partial(reference_token_clip, mode="seq_mean_token_mean", beta=0.04)),
    "dapo": (dict(), functools.partial(reference_token_clip, mode="batch_token_mean", high=0.28)),
    "dapo_group": (dict(aggregation="group_token_mean", group_size=GROUP),
                   functools.partial(reference_token_clip, mode="group_token_mean", high=0.28)),
    "drgrpo": (dict(max_length=WIDTH),
               functools.partial(reference_token_clip, mode="max_length_mean",
                                 max_length=WIDTH)),
    "ppo": (dict(), functools.partial(reference_token_clip, mode="batch_token_mean", dual=3.0)),
    "gspo": (dict(clip_low=0.05, clip_high=0.05),
             functools.partial(reference_gspo, low=0.05, high=0.05)),
    "gspo_token": (dict(ratio="sequence_token", clip_low=0.05, clip_high=0.05),
                   functools.partial(reference_gspo_token, low=0.05, high=0.05)),
    "cispo": (dict(), functools.partial(reference_cispo, high=0.28)),
    "rloo_trl": (dict(ratio="sequence_product", clip="ppo", aggregation="seq_mean_token_mean"),
                 reference_rloo_trl),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
@EXAMPLES
@given(batch=batches(spread=1.3), seed=st.integers(0, 2**32 - 1))
def test_unified_gradient_equals_autodiff_of_the_reference_loss(case, batch, seed):
    """P-U1: the surrogate's gradient and value match the reference loss of spec §6.

    P7: the kernel sees NaN/±Inf in padded slots, the reference zeros; then other garbage
    changes neither value nor gradient, bit for bit.
    """
    options, reference = CASES[case]
    algorithm = case.split("_")[0]
    mask, clean = batch["mask"], batch["clean"]
    loss, grad = kernel(algorithm, batch, **options)
    ref_loss, ref_grad = jax.value_and_grad(lambda lp: reference(clean, mask, lp))(
        jnp.asarray(clean["logp"])
    )
    assert loss == pytest.approx(float(ref_loss), abs=1e-9)
    np.testing.assert_allclose(grad, ref_grad, atol=1e-9)
    np.testing.assert_array_equal(grad[~mask], 0.0)

    rng = np.random.default_rng(seed)
    for name in ("logp", "logp_old", "logp_ref"):
        batch["dirty"][name] = np.where(mask, batch["dirty"][name],
                                        rng.normal(size=(ROWS, WIDTH)) * 1e30)
    again_loss, again_grad = kernel(algorithm, batch, **options)
    assert again_loss == loss
    np.testing.assert_array_equal(again_grad, grad)


# --- P1, P2: at θ = θ_old every clipped objective is REINFORCE ----------------------------------

AT_OLD = ["grpo", "dapo", "drgrpo", "ppo", "gspo", "cispo"]


@EXAMPLES
@given(batch=batches(), aggregation=st.sampled_from(["seq_mean_token_mean", "batch_token_mean",
                                                     "max_length_mean"]))
def test_at_old_policy_gradients_equal_reinforce(batch, aggregation):
    old = batch["dirty"]["logp_old"]
    options = dict(aggregation=aggregation, max_length=WIDTH)
    _, reinforce = kernel("reinforce", batch, logp=old, **options)
    per_sequence = batch["dirty"]["advantages"].ndim == 1
    # Sequence-level GSPO sees the row mean of per-token advantages, so it joins only then.
    for algorithm in AT_OLD if per_sequence else [a for a in AT_OLD if a != "gspo"]:
        loss, grad = kernel(algorithm, batch, logp=old, **options)
        np.testing.assert_allclose(grad, reinforce, atol=1e-12, err_msg=algorithm)
        # P2: at r = 1 nothing is clipped and the value is -Agg(Â).
        minus_agg = reference_aggregate(
            -np.broadcast_to(np.reshape(batch["clean"]["advantages"], (ROWS, -1)), old.shape),
            batch["mask"], aggregation, WIDTH,
        )
        if algorithm != "cispo":  # CISPO's value is -r̂ Â ℓ, not a surrogate of the ratio
            assert loss == pytest.approx(float(minus_agg), abs=1e-12), algorithm


@EXAMPLES
@given(batch=batches(min_length=1, token_advantages=False), low=st.floats(0.01, 0.9),
       high=st.floats(0.01, 5.0), dual=st.floats(1.01, 10.0))
def test_clipping_is_inert_at_ratio_one(batch, low, high, dual):
    rewards = np.random.default_rng(0).integers(0, 2, size=(ROWS // GROUP, GROUP)) * 1.0
    advantages = np.asarray(group_advantages(rewards, "grpo")).reshape(ROWS)
    batch["dirty"]["advantages"] = advantages
    old = batch["dirty"]["logp_old"]
    for options in (dict(), dict(dual_clip=dual)):
        loss, _ = kernel("grpo", batch, logp=old, clip_low=low, clip_high=high, **options)
        # seq_mean_token_mean at r = 1: -mean_i Â_i = 0 for group-centred advantages.
        assert loss == pytest.approx(0.0, abs=1e-12)


# --- P3, P4: clip-higher and dual clip --------------------------------------------------------


def metrics_of(algorithm, batch, **options):
    _, metrics = policy_loss(algorithm, **batch["dirty"], mask=batch["mask"], **options)
    return metrics


@EXAMPLES
@given(batch=batches(spread=1.0), high=st.floats(0.01, 1.0), more=st.floats(0.0, 1.0))
def test_raising_clip_high_clips_fewer_tokens(batch, high, more):
    narrow = metrics_of("dapo", batch, clip_high=high)
    wide = metrics_of("dapo", batch, clip_high=high + more)
    assert float(wide["clip_fraction"]) <= float(narrow["clip_fraction"])
    batch["dirty"]["advantages"] = -np.abs(batch["dirty"]["advantages"])
    narrow = metrics_of("dapo", batch, clip_high=high)
    wide = metrics_of("dapo", batch, clip_high=high + more)
    assert float(wide["clip_fraction"]) == float(narrow["clip_fraction"])  # A < 0 unaffected
    batch["dirty"]["advantages"] = -batch["dirty"]["advantages"]
    dapo, _ = kernel("dapo", batch)
    grpo, _ = kernel("grpo", batch, aggregation="batch_token_mean")
    assert dapo <= grpo + 1e-12


@EXAMPLES
@given(batch=batches(spread=2.0), dual=st.floats(1.05, 4.0))
def test_dual_clip_bounds_negative_advantage_losses(batch, dual):
    batch["dirty"]["advantages"] = -np.abs(batch["dirty"]["advantages"]) - 0.01
    loss, grad = kernel("ppo", batch, dual_clip=dual)
    bound = reference_aggregate(dual * np.abs(np.broadcast_to(
        np.reshape(batch["clean"]["advantages"], (ROWS, -1)), (ROWS, WIDTH))),
        batch["mask"], "batch_token_mean")
    assert loss <= float(bound) + 1e-12
    ratio = np.exp(batch["clean"]["logp"] - batch["clean"]["logp_old"])
    assert np.all(grad[batch["mask"] & (ratio > dual)] == 0.0)


# --- P7, P9: padding and sharding ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("case", ["grpo", "dapo", "dapo_group", "drgrpo", "ppo", "gspo", "rloo"])
@EXAMPLES
@given(batch=batches(spread=1.0))
def test_micro_batches_with_global_totals_reproduce_the_batch_gradient(case, batch):
    options, _ = CASES[case]
    algorithm = case.split("_")[0]
    mask = batch["mask"]
    _, whole = kernel(algorithm, batch, **options)
    halves = [slice(0, GROUP), slice(GROUP, ROWS)]
    totals = jax.tree.map(
        jnp.add, *(batch_totals(mask[h], group_size=GROUP) for h in halves)
    )
    for half in halves:
        piece = dict(mask=mask[half], dirty={
            k: v[half] for k, v in batch["dirty"].items()
        })
        _, grad = kernel(algorithm, piece, totals=totals, **options)
        np.testing.assert_allclose(grad, whole[half], atol=1e-12)


# --- P11 GSPO, P12 CISPO --------------------------------------------------------------------


@EXAMPLES
@given(batch=batches(spread=0.3, min_length=1, token_advantages=False))
def test_gspo_identities(batch):
    mask = batch["mask"]
    options = dict(clip_low=0.1, clip_high=0.1)
    loss, grad = kernel("gspo", batch, **options)
    # The gradient is constant along each sequence.
    for i in range(ROWS):
        np.testing.assert_allclose(grad[i][mask[i]], grad[i][mask[i]][0], atol=1e-12)
    # GSPO-token equals GSPO when the advantage is constant along each sequence.
    token_loss, token_grad = kernel("gspo", batch, ratio="sequence_token", **options)
    assert token_loss == pytest.approx(loss, abs=1e-12)
    np.testing.assert_allclose(token_grad, grad, atol=1e-12)
    # Equal token log-ratios in a row make s_i = r_it: GSPO is then GRPO (seq_mean_token_mean).
    same = batch["dirty"]["logp_old"] + np.linspace(-0.3, 0.3, ROWS)[:, None]
    gspo = kernel("gspo", batch, logp=same, **options)
    grpo = kernel("grpo", batch, logp=same, **options)
    assert gspo[0] == pytest.approx(grpo[0], abs=1e-12)
    # With single-token sequences GSPO and GRPO coincide in value and gradient.
    single = dict(mask=np.eye(ROWS, WIDTH, dtype=bool), dirty=batch["clean"])
    gspo, grpo = kernel("gspo", single, **options), kernel("grpo", single, **options)
    assert gspo[0] == pytest.approx(grpo[0], abs=1e-12)
    np.testing.assert_allclose(gspo[1], grpo[1], atol=1e-12)


@EXAMPLES
@given(batch=batches(spread=1.0))
def test_cispo_gradient_is_the_clipped_weight_times_advantage(batch):
    mask, clean = batch["mask"], batch["clean"]
    _, grad = kernel("cispo", batch)
    advantages = np.broadcast_to(np.reshape(clean["advantages"], (ROWS, -1)), mask.shape)
    weight = np.minimum(np.exp(clean["logp"] - clean["logp_old"]), 1.28)
    expected = np.where(mask, -weight * advantages / mask.sum(), 0.0)
    np.testing.assert_allclose(grad, expected, atol=1e-12)
    assert np.all(grad[mask & (advantages != 0)] != 0.0)

    def loss(logp_BT):
        return policy_loss("cispo", **{**batch["dirty"], "logp": logp_BT}, mask=mask)[0]

    hessian = jax.jit(jax.hessian(loss))(jnp.asarray(np.where(mask, clean["logp"], 0.0)))
    np.testing.assert_array_equal(hessian, 0.0)


# --- P14 value clip ---------------------------------------------------------------------------


@EXAMPLES
@given(batch=batches(), clip=st.floats(0.05, 1.0))
def test_value_clip_is_inert_within_the_clip_range(batch, clip):
    rng = np.random.default_rng(1)
    mask = batch["mask"]
    values_old = rng.normal(size=mask.shape)
    values = values_old + rng.uniform(-clip, clip, mask.shape) * 0.999
    returns = rng.normal(size=mask.shape)
    loss = value_loss(values, values_old, returns, mask, clip=clip)
    half_mse = 0.5 * reference_aggregate((values - returns) ** 2, mask, "batch_token_mean")
    assert float(loss) == pytest.approx(float(half_mse), abs=1e-12)
