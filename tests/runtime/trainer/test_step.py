"""``train_step`` against the NumPy float64 reference (``reference.py``) of REINFORCE and GRPO.

A tiny model scores a ragged batch (length-1 and full-width completions, prompts of 1–3 tokens, a
group whose rewards are all equal); the reference takes the model's float32 logits, computes
log-probs, advantages, the loss and ``∂L/∂logits`` in float64 with loops, and the parameter
gradient is the model's own VJP of that cotangent. The step must report the reference loss and
gradient norm and move the parameters by exactly one AdamW step of the reference gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.algorithms import configure
from runtime.model import ModelConfig, forward, init_params
from runtime.trainer import Sample, StepConfig, make_optimizer, pack, score, train_step
from tests.kernels import objective_fixtures as fx
from tests.runtime.trainer import reference as ref

MODEL = ModelConfig(
    vocab_size=13, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
    intermediate_size=32, initializer_range=0.5,  # wide weights: log-probs far from uniform
)
WIDTH = 8
PAD = 0
TEMPERATURE = 0.7
# One AdamW step from a fresh state has bias-corrected moments m̂ = g and v̂ = g², so it moves
# every parameter by -lr·g/(|g| + eps). eps = 1 keeps the size of g in the update (eps ≪ |g|
# would keep only its sign), and a max_grad_norm far above ‖g‖ leaves the clip inert.
LR, ADAM_EPS, NO_CLIP = 1.0, 1.0, 1e9
# (prompt, completion, reward); groups of 3. Group 0 has a length-1 completion and one that fills
# the width (3 + 5 = 8); its GRPO advantages are +, -, + (rewards 1, 0, 0.75 around 0.583).
# Group 1 has all-equal rewards (advantage exactly 0) and another full-width row (1 + 7 = 8).
ROWS = [
    ([1, 3], [5], 1.0),
    ([1, 4, 6], [7, 8, 9, 10, 11], 0.0),
    ([1], [2, 12, 3], 0.75),
    ([1, 5], [6, 7], 0.5),
    ([1], [4, 4, 4, 4, 4, 4, 4], 0.5),
    ([1, 2, 3], [9], 0.5),
]
G = 3
# δ = ℓ_old - ℓ per off-policy completion token, cycled in row order, so r = exp(-δ) is 1.35 on
# row 0 (A > 0: clipped at 1.2), 0.74 1.11 0.61 0.95 1.35 on row 1 (A < 0: the first and third
# clipped at 0.8), 1.65 0.90 0.74 on row 2 (A > 0: the first clipped). No r is within 1e-2 of an
# edge, where float32 rounding could flip a clip decision.
DELTAS = np.array([-0.3, 0.3, -0.1, 0.5, 0.05, -0.3, -0.5, 0.1, 0.3])
# The step is float32, the reference float64 from the same float32 logits; eager runs sum in
# other orders than the compiled step. Measured worst cases over jit and eager in brackets.
# A log-prob is a difference of numbers of the size of the largest tempered logit, |z/T| ≈ 10.5,
# where float32 spacing is 9.5e-7: a few spacings [2.3e-6]. The loss sums ~20 terms of size up
# to ~7, each rounded by ~5e-7 [6.6e-7]; ‖g‖ sums squares of float32 gradients [1.5e-6
# relative]. The update is Adam's float32 arithmetic: its bias correction 1 - 0.999 is 1.3e-5 off
# in float32, which moves √v̂ and every update by up to 6.4e-6 relative [6e-6 of the largest
# update, absolute].
LOGP_TOL = 5e-6
LOSS_TOL = 3e-6
NORM_RTOL = 1e-5
UPDATE_RTOL = 3e-5


def _params():
    params = init_params(MODEL, key=jax.random.key(7))
    keys = iter(jax.random.split(jax.random.key(8), 64))
    # Norm scales away from 1 so that their gradients are checked as well.
    return jax.tree_util.tree_map_with_path(
        lambda path, x: x * (1.0 + 0.3 * jax.random.normal(next(keys), x.shape))
        if path[-1].key == "scale" else x,
        params,
    )


def _batch():
    samples = [
        Sample(np.int32(p), np.int32(c), np.float32(-1.0 - 0.1 * np.arange(len(c))), r, 0)
        for p, c, r in ROWS
    ]
    return pack(samples, group_size=G, width=WIDTH, pad_id=PAD)


def _reference(params, batch, objective: str, current_B):
    """``(loss, ‖g‖, update tree, logp_BS, logp_old_BS)`` of the reference for ``objective``.

    Off-policy rows were "sampled" from a policy whose log-probs are ``ℓ + δ``.
    """
    tokens_BT = np.asarray(batch.tokens_BT)
    logits_BTV, vjp = jax.vjp(
        lambda p: forward(p, batch.tokens_BT, batch.attention_BT, config=MODEL), params
    )
    logp_BS, probs_BSV = ref.token_logprobs(np.asarray(logits_BTV), tokens_BT, TEMPERATURE)
    mask_BS = np.asarray(batch.mask_BS)
    logp_old_BS = np.zeros(logp_BS.shape)
    logp_old_BS[mask_BS] = logp_BS[mask_BS] + np.resize(DELTAS, mask_BS.sum())
    rewards_MG = np.asarray(batch.rewards_MG, np.float64)
    if objective == "reinforce":
        loss, grad_BS = ref.reinforce(logp_BS, mask_BS, rewards_MG.reshape(-1))
    else:
        old_BS = np.where(current_B[:, None], logp_BS, logp_old_BS)
        advantages_B = ref.grpo_advantages(rewards_MG, eps=1e-6)
        loss, grad_BS = ref.grpo(logp_BS, old_BS, mask_BS, advantages_B, clip=0.2)
    cotangent = ref.logits_cotangent(grad_BS, probs_BSV, tokens_BT, TEMPERATURE)
    (grads,) = vjp(jnp.asarray(cotangent, jnp.float32))
    grads = jax.tree.map(lambda g: np.asarray(g, np.float64), grads)
    norm = np.sqrt(sum(np.sum(g**2) for g in jax.tree.leaves(grads)))
    update = jax.tree.map(lambda g: -LR * g / (np.abs(g) + ADAM_EPS), grads)
    return loss, norm, update, logp_BS, logp_old_BS


def _run_step(params, batch, objective: str, logp_old_BS, current_B, use_jit: bool):
    config = StepConfig(
        model=MODEL, objective=configure(objective), learning_rate=LR, adam_eps=ADAM_EPS,
        max_grad_norm=NO_CLIP, temperature=TEMPERATURE,
    )
    opt_state = make_optimizer(config).init(params)
    donated = jax.tree.map(jnp.array, params)  # the step donates its parameters
    args = (donated, opt_state, jax.device_put(batch), jnp.float32(logp_old_BS),
            jnp.zeros(batch.mask_BS.shape, jnp.float32), jnp.asarray(current_B))
    if use_jit:
        return train_step(*args, config=config)
    with jax.disable_jit():
        return train_step(*args, config=config)


def _check_against_reference(objective, current_B, use_jit):
    params, batch = _params(), _batch()
    loss, norm, update, logp_BS, logp_old_BS = _reference(params, batch, objective, current_B)
    new_params, _, metrics = _run_step(params, batch, objective, logp_old_BS, current_B, use_jit)

    assert float(metrics["loss"]) == pytest.approx(loss, rel=LOSS_TOL, abs=LOSS_TOL)
    assert float(metrics["grad_norm"]) == pytest.approx(norm, rel=NORM_RTOL)
    moved = jax.tree.map(lambda new, old: np.float64(new) - np.float64(old), new_params, params)
    scale = max(np.max(np.abs(u)) for u in jax.tree.leaves(update))
    for path, got in jax.tree_util.tree_leaves_with_path(moved):
        want = dict(jax.tree_util.tree_leaves_with_path(update))[path]
        np.testing.assert_allclose(got, want, rtol=UPDATE_RTOL, atol=UPDATE_RTOL * scale,
                                   err_msg=jax.tree_util.keystr(path))
    return metrics, logp_BS, logp_old_BS


@pytest.mark.slow
@pytest.mark.parametrize("use_jit", [True, False], ids=["jit", "eager"])
def test_reinforce_matches_the_reference(use_jit):
    current_B = np.ones(len(ROWS), bool)
    metrics, _, _ = _check_against_reference("reinforce", current_B, use_jit)
    assert float(metrics["reward_mean"]) == pytest.approx(np.mean([r for *_, r in ROWS]))


@pytest.mark.slow
@pytest.mark.parametrize("use_jit", [True, False], ids=["jit", "eager"])
@pytest.mark.parametrize("current", ["on_policy", "off_policy", "mixed"])
def test_grpo_matches_the_reference(current, use_jit):
    current_B = {
        "on_policy": np.ones(len(ROWS), bool),  # r ≡ 1: no clipping, L = -mean_i Â_i = 0
        "off_policy": np.zeros(len(ROWS), bool),  # every row through the given old log-probs
        "mixed": np.array([True, False, False, True, False, True]),
    }[current]
    metrics, logp_BS, logp_old_BS = _check_against_reference("grpo", current_B, use_jit)
    batch = _batch()
    old_BS = np.where(current_B[:, None], logp_BS, logp_old_BS)
    mismatch_BS = np.where(batch.mask_BS, np.abs(old_BS - batch.behaviour_BS), 0.0)
    assert float(metrics["logprob_mismatch_max"]) == pytest.approx(mismatch_BS.max(), abs=LOSS_TOL)
    if current == "on_policy":
        assert float(metrics["clip_fraction"]) == 0.0
    else:
        assert float(metrics["clip_fraction"]) > 0.0


def test_score_is_the_reference_log_prob():
    params, batch = _params(), _batch()
    config = StepConfig(model=MODEL, objective=configure("grpo"), temperature=TEMPERATURE)
    got_BS = np.asarray(score(params, batch.tokens_BT, batch.attention_BT, config=config))
    _, _, _, want_BS, _ = _reference(params, batch, "reinforce", None)
    np.testing.assert_allclose(got_BS[batch.mask_BS], want_BS[batch.mask_BS], rtol=0,
                               atol=LOGP_TOL)


def test_the_reference_reproduces_the_spec_examples():
    """The reference's closed forms on fixture F (§6.1 E-RF, §6.2 E-GRPO), to the spec's 6 digits."""
    logp = np.where(fx.F_MASK, fx.F_LOGP, 0.0)
    loss, grad = ref.reinforce(logp, fx.F_MASK, fx.F_REWARDS)
    assert loss == pytest.approx(0.9575, abs=1e-6)  # -(1/4)[(-0.90-0.28-2.05) + (-0.60)]
    np.testing.assert_allclose(grad[fx.F_MASK], np.where(
        np.repeat(fx.F_REWARDS, fx.F_LENGTHS) > 0, -0.25, 0.0), atol=1e-12)

    advantages = ref.grpo_advantages(fx.F_REWARDS[None, :], eps=1e-6)
    np.testing.assert_allclose(advantages, [0.866024, -0.866024, -0.866024, 0.866024], atol=1e-6)
    old = np.where(fx.F_MASK, fx.F_LOGP_OLD, 0.0)
    loss, grad = ref.grpo(logp, old, fx.F_MASK, advantages, clip=0.2)
    assert loss == pytest.approx(-0.060091, abs=1e-6)
    want = fx.padded([
        [-0.079759, 0.000000, -0.068649],
        [0.000000, 0.132220],
        [0.054126, 0.048976, 0.069500, 0.000000],
        [0.000000],
    ], fx.F_MASK)
    np.testing.assert_allclose(grad, want, atol=1e-6)
    # A group of equal rewards carries no signal.
    np.testing.assert_array_equal(ref.grpo_advantages(np.full((1, 3), 0.5), eps=1e-6), [0, 0, 0])


def test_warmup_scales_each_early_update_by_its_step():
    """``trainer.warmup_steps``: the n-th update (0-based) is ``min(1, (n + 1) / warmup)`` of the
    constant-rate one. With a constant gradient Adam's bias-corrected step is the same every time,
    so the ratio of the two optimizers' updates is the schedule itself."""
    model = ModelConfig(vocab_size=8, hidden_size=8, num_layers=1, num_heads=1, num_kv_heads=1, intermediate_size=8)
    base = StepConfig(model=model, objective=configure("reinforce"), learning_rate=0.1)
    warm = StepConfig(model=model, objective=configure("reinforce"), learning_rate=0.1, warmup_steps=4)
    params = {"w": jnp.ones((3,), jnp.float32)}
    grads = {"w": jnp.asarray([0.5, -1.0, 2.0], jnp.float32)}
    plain, ramped = make_optimizer(base), make_optimizer(warm)
    s_plain, s_ramped = plain.init(params), ramped.init(params)
    for n in range(6):
        u_plain, s_plain = plain.update(grads, s_plain, params)
        u_ramped, s_ramped = ramped.update(grads, s_ramped, params)
        # The schedule is exact in float32 up to one rounding of lr * fraction.
        np.testing.assert_allclose(u_ramped["w"], min(1.0, (n + 1) / 4) * u_plain["w"], rtol=1e-6)


def test_the_overlong_buffer_punishes_long_completions_before_the_advantages():
    """DAPO's ``overlong_buffer``: equal task rewards, one completion at the maximum length, so
    only the length penalty (-1 at ``max_length``) can separate the two advantages."""
    from runtime.trainer.step import _advantages

    rewards_MG = jnp.asarray([[1.0, 1.0]], jnp.float32)
    mask_BS = jnp.asarray([[True] * 2 + [False] * 6, [True] * 8], bool)  # lengths 2 and 8
    logp_BS = jnp.zeros((2, 8), jnp.float32)
    plain = configure("dapo", group_size=2, max_length=8)
    punished = configure("dapo", group_size=2, max_length=8, overlong_buffer=4)
    assert np.all(np.asarray(_advantages(plain, rewards_MG, logp_BS, logp_BS, mask_BS)) == 0.0)
    adv = np.asarray(_advantages(punished, rewards_MG, logp_BS, logp_BS, mask_BS))
    assert adv[0] > 0 > adv[1]  # the short one is better once the long one loses its length reward


def test_kto_leaves_rows_at_their_group_mean_unlabelled():
    """KTO labels a completion desirable above its group's mean reward and undesirable below it.
    A group whose rewards are all equal (all right, or all wrong) gives no label and no gradient:
    labelled undesirable, an all-correct group would push down every right answer (the
    algorithms study's collapse to 0%). The reference differs from the policy, so every labelled
    row has a gradient."""
    config = StepConfig(model=MODEL, objective=configure("kto"), learning_rate=0.1, temperature=TEMPERATURE)
    params = _params()
    reference = init_params(MODEL, key=jax.random.key(11))

    def step(rewards):
        samples = [Sample(np.int32(p), np.int32(c), np.float32(-1.0 - 0.1 * np.arange(len(c))), r, 0)
                   for (p, c, _), r in zip(ROWS, rewards, strict=True)]
        batch = jax.device_put(pack(samples, group_size=G, width=WIDTH, pad_id=PAD))
        logp_ref = score(reference, batch.tokens_BT, batch.attention_BT, config=config)
        p = jax.tree.map(jnp.array, params)
        new, _, metrics = train_step(p, make_optimizer(config).init(p), batch, jnp.zeros_like(logp_ref), logp_ref,
                                     jnp.ones(len(ROWS), bool), config=config)
        moved = max(float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(params),
                                                                 strict=True))
        return float(metrics["labelled"]), moved

    assert step([1.0, 1.0, 1.0, 0.0, 0.0, 0.0]) == (0.0, 0.0)  # an all-correct and an all-wrong group
    labelled, moved = step([1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    assert labelled == 3.0 and moved > 1e-3
