"""Where the old log-probs of older rollouts come from: ``trainer.old_logprobs``.

``"recompute"`` scores rows sampled from an older version with that version's weights;
``"behaviour"`` takes the engine's log-probs for them. A new run resolves the choice from its
model's dtype, a run logged before the option existed recomputes, and with ``"behaviour"`` the
log-prob mismatch metrics cover the on-policy rows only (older rows would measure 0 by
construction).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.algorithms import configure
from runtime.config import Config, ConfigError, load_config
from runtime.session import step_config
from runtime.trainer import Sample, StepConfig, make_optimizer, pack, train_step
from tests.runtime.trainer.test_step import MODEL, _params

G, WIDTH = 3, 10
PROMPTS = [[1, 7, 8, 9], [1, 3, 3, 4, 5]]  # tokens of the test model's 13
COMPLETIONS = [[5, 6], [6, 7, 8, 2], [9, 2], [4, 2], [5, 5, 5], [10, 11, 2]]
REWARDS = [1.0, 0.0, 0.5, 0.0, 1.0, 0.25]


def test_a_new_run_takes_the_engines_log_probs_for_a_float32_model_only():
    assert load_config(None, []).trainer.old_logprobs == "behaviour"
    assert load_config(None, ["model.dtype=bfloat16"]).trainer.old_logprobs == "recompute"
    assert load_config(None, ["trainer.old_logprobs=recompute"]).trainer.old_logprobs == "recompute"
    with pytest.raises(ConfigError) as e:
        load_config(None, ["trainer.old_logprobs=engine"])
    message = str(e.value)
    assert "'engine'" in message and "recompute, behaviour" in message and "\n" not in message


def test_a_config_logged_before_the_option_recomputes():
    logged = load_config(None, []).to_dict()
    del logged["trainer"]["old_logprobs"]
    config = Config.from_dict(logged)
    assert config.trainer.old_logprobs is None
    model = type("M", (), {"config": MODEL})()
    assert step_config(config, model).old_logprobs == "recompute"
    assert step_config(load_config(None, []), model).old_logprobs == "behaviour"


@pytest.mark.slow
def test_with_the_engines_log_probs_only_on_policy_rows_measure_the_mismatch():
    params = _params()
    samples = [Sample(np.int32(PROMPTS[i // G]), np.int32(c), np.float32(-1.0 - 0.1 * np.arange(len(c))), r, 0)
               for i, (c, r) in enumerate(zip(COMPLETIONS, REWARDS, strict=True))]
    batch = pack(samples, group_size=G, width=WIDTH, pad_id=0)
    mask = np.asarray(batch.mask_BS)
    current = np.array([True, True, True, False, False, False])
    # Older rows carry the engine's log-probs as their old ones: their mismatch is 0 by construction.
    old = np.where(current[:, None], 0.0, batch.behaviour_BS).astype(np.float32)
    metrics = {}
    for mode in ("recompute", "behaviour"):
        config = StepConfig(model=MODEL, objective=configure("grpo"), group_size=G, old_logprobs=mode)
        p = jax.tree.map(jnp.array, params)
        _, _, m = train_step(p, make_optimizer(config).init(p), jax.device_put(batch), jnp.asarray(old),
                             jnp.zeros(mask.shape, jnp.float32), jnp.asarray(current), config=config)
        metrics[mode] = {k: float(v) for k, v in m.items()}
    # The on-policy rows' old log-probs are the step's own forward pass, which is not the
    # engine's (-1, -1.1, ...): a real mismatch there, the same maximum in both modes.
    assert metrics["behaviour"]["logprob_mismatch_max"] == metrics["recompute"]["logprob_mismatch_max"] > 0.1
    on_policy = mask & current[:, None]
    ratio = mask.sum() / on_policy.sum()  # recompute averages the older rows' zeros in
    assert metrics["behaviour"]["logprob_mismatch_mean"] == pytest.approx(
        metrics["recompute"]["logprob_mismatch_mean"] * ratio, rel=1e-5)
    # The loss and the update do not depend on how the mismatch is measured.
    assert np.isfinite(metrics["behaviour"]["loss"])
    assert metrics["behaviour"]["loss"] == metrics["recompute"]["loss"]
    assert StepConfig(model=MODEL, objective=configure("grpo")).old_logprobs == "recompute"
