"""Log-probs at the completion window only: the step's logits where its objective reads them.

With ``completion_window = C`` the whole-batch step runs the LM head and the log-softmax over
each row's ``C`` positions from its first completion target instead of over every position.
Loss, gradient and update must be the full step's to float32 rounding, with and without the
shared prompt, a row's window running past the batch's width included; positions outside the
window read 0; a completion longer than the window is refused when the batch is packed; a new
run takes the window of its ``sampling.max_tokens`` and a run logged before the option did not.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from kernels.algorithms import configure
from runtime.config import Config, ConfigError, load_config
from runtime.errors import RlxError
from runtime.model import init_params
from runtime.session import step_config
from runtime.trainer import StepConfig, pack, score
from runtime.trainer.batch import shared_prefix
from tests.runtime.trainer.test_shared_prefix import MODEL, WIDTH, G, _samples, assert_same_step, steps_side_by_side

WINDOW = 8  # the longest completion; the 6-token prompt's window runs 2 positions past the width


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["grpo", "kl_grpo"])
@pytest.mark.parametrize("prefix", [0, 4])
def test_a_step_on_the_completion_window_equals_the_full_step(objective, prefix):
    obj = configure("grpo", kl_coef=0.05) if objective == "kl_grpo" else configure("grpo")
    params = init_params(MODEL, key=jax.random.key(3))
    samples = _samples()
    batch = jax.device_put(pack(samples, group_size=G, width=WIDTH, pad_id=0, window=WINDOW))
    # lr 1 and Adam's eps 1: the update is about -g, so it compares gradients (see test_step).
    full = StepConfig(model=MODEL, objective=obj, learning_rate=1.0, adam_eps=1.0, max_grad_norm=1e9, group_size=G,
                      share_prefix=prefix > 0, prefix=prefix)
    window = dataclasses.replace(full, completion_window=WINDOW)
    assert prefix in (0, shared_prefix(samples, G))
    mask = np.asarray(batch.mask_BS)
    logp = {c.completion_window: np.asarray(score(params, batch.tokens_BT, batch.attention_BT, batch.mask_BS, config=c))
            for c in (full, window)}
    np.testing.assert_allclose(logp[WINDOW][mask], logp[0][mask], atol=1e-5)
    starts = mask.argmax(axis=1)
    inside = (np.arange(mask.shape[1])[None, :] >= starts[:, None]) & (np.arange(mask.shape[1])[None, :] < starts[:, None] + WINDOW)
    assert (logp[WINDOW][~inside] == 0).all() and (logp[WINDOW][inside] < 0).all()
    out0, out_window = steps_side_by_side(params, batch, logp[0], (full, window))
    assert_same_step(params, out_window, out0, ("loss", "grad_norm", "entropy", "kl_ref"))
    assert float(out0[2]["grad_norm"]) > 0.01


def test_a_completion_longer_than_the_window_is_refused_when_packed():
    samples = _samples()
    pack(samples, group_size=G, width=WIDTH, pad_id=0, window=WINDOW)
    with pytest.raises(RlxError) as e:
        pack(samples, group_size=G, width=WIDTH, pad_id=0, window=WINDOW - 1)
    assert "row 2: a completion of 8 tokens is longer than the train step's completion window of 7" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_new_run_computes_logits_at_its_completions_unless_a_memory_bound_is_set():
    assert load_config(None, []).trainer.completion_logits is True
    assert load_config(None, ["trainer.logits_chunk=8"]).trainer.completion_logits is False
    with pytest.raises(ConfigError) as e:
        load_config(None, ["trainer.completion_logits=true", "trainer.remat=true"])
    assert "trainer.completion_logits" in str(e.value) and "\n" not in str(e.value)
    logged = load_config(None, []).to_dict()
    del logged["trainer"]["completion_logits"]
    config = Config.from_dict(logged)
    assert config.trainer.completion_logits is None
    model = type("M", (), {"config": MODEL})()
    assert step_config(config, model).completion_window == 0
    assert step_config(load_config(None, ["sampling.max_tokens=9"]), model).completion_window == 9
