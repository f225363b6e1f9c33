"""DPO and KTO invariants (spec §7 P15, P16) and their unified gradient (P-U1)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.errors import ObjectiveConfigError
from kernels.objectives import preference_loss

EXAMPLES = settings(max_examples=max(6, settings.default.max_examples // 10))
ROWS, WIDTH = 6, 5


@pytest.fixture(autouse=True)
def _float64():
    with jax.enable_x64(True):
        yield


@st.composite
def completions(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lengths = rng.integers(1, WIDTH + 1, size=ROWS)
    mask = np.arange(WIDTH)[None, :] < lengths[:, None]
    logp = -rng.uniform(0.05, 3.0, (ROWS, WIDTH))
    logp_ref = logp + rng.normal(0.0, 1.0, (ROWS, WIDTH))
    return mask, np.where(mask, logp, np.nan), np.where(mask, logp_ref, np.inf)


def sequence_sums(logp, mask):
    return jnp.sum(jnp.where(mask, logp, 0.0), axis=1)


def dpo(logp, logp_ref, mask, **options):
    return preference_loss("dpo", logp=logp, logp_ref=logp_ref, mask=mask, **options)


def reference_dpo(logp, logp_ref, mask, beta=0.1, smoothing=0.0):
    ratio = sequence_sums(logp, mask) - sequence_sums(logp_ref, mask)
    chosen, rejected = jnp.split(ratio, 2)
    margin = beta * (chosen - rejected)
    return jnp.mean(-(1 - smoothing) * jax.nn.log_sigmoid(margin)
                    - smoothing * jax.nn.log_sigmoid(-margin))


@pytest.mark.slow
@EXAMPLES
@given(completions(), st.floats(0.01, 1.0), st.floats(0.0, 0.45))
def test_dpo_gradient_equals_autodiff_of_the_reference(data, beta, smoothing):
    mask, logp, logp_ref = data
    options = dict(beta=beta, label_smoothing=smoothing)
    (loss, _), grad = jax.value_and_grad(dpo, has_aux=True)(jnp.asarray(logp), logp_ref, mask,
                                                             **options)
    clean = np.where(mask, logp, 0.0), np.where(mask, logp_ref, 0.0)
    ref_loss, ref_grad = jax.value_and_grad(reference_dpo)(jnp.asarray(clean[0]), clean[1],
                                                           mask, beta, smoothing)
    assert float(loss) == pytest.approx(float(ref_loss), abs=1e-12)
    np.testing.assert_allclose(grad, ref_grad, atol=1e-12)
    # Chosen and rejected rows of a pair get gradients equal in size and opposite in sign.
    per_row = np.array([g[m][0] for g, m in zip(np.asarray(grad), mask, strict=True)])
    np.testing.assert_allclose(per_row[:ROWS // 2], -per_row[ROWS // 2:], atol=1e-15)


@pytest.mark.slow
@EXAMPLES
@given(completions(), st.floats(-50.0, 50.0))
def test_dpo_margin_identities(data, shift):
    mask, logp, logp_ref = data
    loss, metrics = dpo(logp, logp_ref, mask)
    swapped = lambda x: np.concatenate(np.split(x, 2)[::-1])  # noqa: E731
    _, metrics_swapped = dpo(swapped(logp), swapped(logp_ref), swapped(mask))
    # Swapping maps Δ → -Δ; with one pair, L(Δ) - L(-Δ) = -βΔ.
    assert float(metrics_swapped["reward_margin"]) == pytest.approx(
        -float(metrics["reward_margin"]), abs=1e-12)
    one = lambda x: x[[0, ROWS // 2]]  # noqa: E731
    first, first_metrics = dpo(one(logp), one(logp_ref), one(mask))
    flipped, _ = dpo(one(logp)[::-1], one(logp_ref)[::-1], one(mask)[::-1])
    assert float(first - flipped) == pytest.approx(-float(first_metrics["reward_margin"]),
                                                   abs=1e-12)
    # A constant added to one sequence's policy and reference log-probs changes nothing.
    moved = np.where(mask, shift / mask.sum(axis=1, keepdims=True), 0.0)
    loss_moved, _ = dpo(logp + moved, logp_ref + moved, mask)
    assert float(loss_moved) == pytest.approx(float(loss), abs=1e-9)


def test_dpo_decreases_in_the_margin_and_is_log2_at_zero():
    margins = np.linspace(-30.0, 30.0, 61)
    ones = np.ones((2, 1), bool)
    losses = [float(dpo(np.array([[m], [0.0]]), np.zeros((2, 1)), ones)[0]) for m in margins]
    assert np.all(np.diff(losses) < 0)
    assert losses[30] == pytest.approx(np.log(2.0), abs=1e-12)


def kto(logp, logp_ref, mask, desirable, z0, **options):
    return preference_loss("kto", logp=logp, logp_ref=logp_ref, mask=mask, desirable=desirable,
                           reference_point=z0, **options)


def reference_kto(logp, logp_ref, mask, desirable, z0, beta, weight_d, weight_u):
    ratio = sequence_sums(logp, mask) - sequence_sums(logp_ref, mask)
    losses = jnp.where(desirable, weight_d * (1 - jax.nn.sigmoid(beta * (ratio - z0))),
                       weight_u * (1 - jax.nn.sigmoid(beta * (z0 - ratio))))
    return jnp.mean(losses)


@pytest.mark.slow
@EXAMPLES
@given(completions(), st.lists(st.booleans(), min_size=ROWS, max_size=ROWS),
       st.floats(0.0, 2.0), st.floats(0.01, 1.0), st.floats(0.5, 2.0), st.floats(0.5, 2.0))
def test_kto_gradient_equals_autodiff_of_the_reference(data, labels, z0, beta, w_d, w_u):
    mask, logp, logp_ref = data
    desirable = np.array(labels)
    options = dict(beta=beta, desirable_weight=w_d, undesirable_weight=w_u)
    (loss, _), grad = jax.value_and_grad(kto, has_aux=True)(
        jnp.asarray(logp), logp_ref, mask, desirable, z0, **options)
    clean = np.where(mask, logp, 0.0), np.where(mask, logp_ref, 0.0)
    ref_loss, ref_grad = jax.value_and_grad(reference_kto)(
        jnp.asarray(clean[0]), clean[1], mask, desirable, z0, beta, w_d, w_u)
    assert float(loss) == pytest.approx(float(ref_loss), abs=1e-12)
    np.testing.assert_allclose(grad, ref_grad, atol=1e-12)


@pytest.mark.slow
@EXAMPLES
@given(completions())
def test_kto_reference_point_is_nonnegative_and_constant(data):
    mask, logp, logp_ref = data
    desirable = np.arange(ROWS) % 2 == 0

    shifted = lambda x: np.roll(x, 1, axis=0)  # noqa: E731  (TRL's mismatched pairing)

    def loss_of_mismatched(mismatched):
        return preference_loss(
            "kto", logp=logp, logp_ref=logp_ref, mask=mask, desirable=desirable,
            mismatched_logp=mismatched, mismatched_logp_ref=shifted(logp_ref),
            mismatched_mask=shifted(mask),
        )

    (_, metrics), grad = jax.value_and_grad(loss_of_mismatched, has_aux=True)(
        jnp.asarray(shifted(logp)))
    assert float(metrics["reference_point"]) >= 0.0
    np.testing.assert_array_equal(grad, 0.0)


@pytest.mark.slow
def test_kto_shape_of_the_value():
    ones = np.ones((4, 1), bool)
    desirable = np.array([True, True, False, False])
    ratios = np.array([[0.3], [0.3], [0.3], [0.3]])
    # r_θ = z0 everywhere: every loss is λ/2.
    loss, _ = kto(ratios, np.zeros((4, 1)), ones, desirable, 0.3, desirable_weight=1.5)
    assert float(loss) == pytest.approx((1.5 / 2 * 2 + 1 / 2 * 2) / 4, abs=1e-12)
    grid = np.linspace(-20, 20, 41)
    per_label = {
        label: [float(kto(np.array([[r]]), np.zeros((1, 1)), ones[:1], np.array([label]), 0.0)[0])
                for r in grid]
        for label in (True, False)
    }
    assert np.all(np.diff(per_label[True]) < 0)  # desirable: falls as r_θ rises
    assert np.all(np.diff(per_label[False]) > 0)  # undesirable: rises with r_θ
    # λ_D = λ_U: flipping the label and negating r_θ - z0 leaves the loss unchanged.
    np.testing.assert_allclose(per_label[True], per_label[False][::-1], atol=1e-15)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: dpo(np.zeros((3, 2)), np.zeros((3, 2)), np.ones((3, 2), bool)), "B must be even"),
        (lambda: preference_loss("kto", logp=np.zeros((2, 1)), logp_ref=np.zeros((2, 1)),
                                 mask=np.ones((2, 1), bool)), "needs desirable"),
        (lambda: preference_loss("kto", logp=np.zeros((2, 1)), logp_ref=np.zeros((2, 1)),
                                 mask=np.ones((2, 1), bool), desirable=np.ones(2, bool)),
         "needs reference_point or the mismatched"),
        (lambda: preference_loss("grpo", logp=np.zeros((2, 1)), logp_ref=np.zeros((2, 1)),
                                 mask=np.ones((2, 1), bool)), "use policy_loss; preference_loss "
                                                              "accepts: dpo, kto"),
    ],
)
def test_bad_preference_input_is_rejected(call, message):
    with pytest.raises(ObjectiveConfigError, match=message):
        call()
