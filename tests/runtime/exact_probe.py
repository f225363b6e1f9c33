"""Sample with the exact engine, score with the exact train step, count the log-probs that differ.

Run as ``python -m tests.runtime.exact_probe SEED CASES DTYPE`` in a process whose ``XLA_FLAGS``
carry ``runtime.numerics.NO_FMA_FLAG`` (``test_exact_logprobs`` starts it); with a fourth argument
``unchecked``, in any process (the control: without the flag the bits differ). Each case draws an
engine (slots, page size, prefill rows, a pool small enough to preempt or not, continuous or static
batching), groups of prompts of random lengths sampled at one random temperature, then scores
every completion four ways: the train step's ``score`` on padded rows, on packed rows
(``pack_bins`` with sequences on page boundaries), on padded rows with each group's prompt computed
once and the LM head at the completions only (a run's default step), and that step's own forward
pass (its ``logprob_mismatch_max`` over on-policy rows). The last line is a JSON object: per case, the
draw and the number of completion tokens whose log-prob bits differ, for each way.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from kernels.algorithms import configure
from runtime.inference import Engine, SamplingParams
from runtime.inference.engine import compute_params
from runtime.model import Model, ModelConfig
from runtime.numerics import check_exact_backend
from runtime.trainer import Sample, StepConfig, make_optimizer, pack, train_step
from runtime.trainer.batch import pack_bins
from runtime.trainer.step import score
from tests.runtime.inference.conftest import CONFIG, widened_model


def model_config(dtype: str) -> ModelConfig:
    """The engine tests' tiny decoder in ``dtype``."""
    return dataclasses.replace(CONFIG, dtype=dtype)


def case(model: Model, gen: np.random.Generator) -> dict:
    config = model.config
    slots = int(gen.choice([3, 8, 64]))
    page = int(gen.choice([2, 4, 8]))
    max_seq = 32
    pages_per_seq = max_seq // page
    small_pool = bool(gen.integers(2))
    num_pages = (pages_per_seq + 2 if small_pool else slots * pages_per_seq) + 1
    engine = Engine(model, max_slots=slots, page_size=page, num_pages=num_pages, max_seq_len=max_seq,
                    prefill_tokens=int(gen.choice([16, 64, 128])), attention_impl="ordered")
    G = int(gen.choice([2, 4]))
    M = int(gen.integers(1, 6))
    temperature = float(gen.choice([0.7, 1.0, 1.3]))
    prompts, params = [], []
    for _ in range(M):
        prompt = gen.integers(3, config.vocab_size, int(gen.integers(1, 20))).tolist()
        for _ in range(G):
            prompts.append(prompt)
            params.append(SamplingParams(temperature=temperature, ignore_eos=bool(gen.integers(2)),
                                         max_tokens=int(gen.integers(1, max_seq - len(prompt) + 1))))
    seeds = [int(s) for s in gen.integers(0, 2**63, len(prompts))]
    batching = str(gen.choice(["continuous", "static"]))
    completions = engine.generate(prompts, params, seeds, batching=batching)
    samples = [Sample(np.int32(p), c.tokens, c.logprobs, float(i % 2), 0)
               for i, (p, c) in enumerate(zip(prompts, completions, strict=True))]
    step = StepConfig(model=config, objective=configure("grpo"), group_size=G, temperature=temperature,
                      old_logprobs="behaviour", exact_block=page)
    weights = compute_params(model.params, config)
    padded = pack(samples, group_size=G, width=max_seq, pad_id=0)
    packed = pack_bins(samples, group_size=G, width=max_seq, pad_id=0, align=page)
    mask = np.asarray(padded.mask_BS)
    # A run's default step: each group's prompt once (the shortest prompt), the LM head at the completions only.
    shared = dataclasses.replace(step, prefix=min(len(p) for p in prompts),
                                 completion_window=max(len(c.tokens) for c in completions))
    differ = {}
    for name, batch, config in (("padded", padded, step), ("packed", packed, step), ("shared", padded, shared)):
        logp = score(weights, jnp.asarray(batch.tokens_BT), jnp.asarray(batch.attention_BT), jnp.asarray(batch.mask_BS),
                     None if batch.rows_BS is None else jnp.asarray(batch.rows_BS), config=config)
        differ[name] = int(np.sum((np.asarray(logp) != padded.behaviour_BS) & mask))
    opt = make_optimizer(step).init(weights)
    zeros = jnp.zeros(mask.shape, jnp.float32)
    _, _, metrics = train_step(jax.tree.map(jnp.array, weights), opt, jax.device_put(padded), zeros, zeros,
                               jnp.ones(len(samples), bool), config=shared)
    return {"slots": slots, "page": page, "small_pool": small_pool, "groups": M, "group_size": G,
            "batching": batching, "tokens": int(mask.sum()), "differ": differ,
            "step_mismatch_max": float(metrics["logprob_mismatch_max"]),
            "preemptions": engine.last_stats.preemptions if engine.last_stats else None}


def main(argv: list[str]) -> int:
    seed, cases, dtype = int(argv[1]), int(argv[2]), argv[3]
    if argv[4:] != ["unchecked"]:
        check_exact_backend()
    model = widened_model(seed, model_config(dtype))
    gen = np.random.default_rng(seed)
    print(json.dumps({"dtype": dtype, "cases": [case(model, gen) for _ in range(cases)]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
