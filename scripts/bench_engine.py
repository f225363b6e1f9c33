#!/usr/bin/env python
"""The inference engine at a real checkpoint's lengths: SmolLM2-135M-Instruct's weights (from
``scripts/get_model smollm2``; random weights of its shape with ``--random`` or where it is not
installed), prompts of 100–400 tokens, each sampled by a group of ``--group`` requests, completion
lengths drawn log-normally (median 64, at most 512).

Usage: python scripts/bench_engine.py [--prompts 64] [--group 8] [--slots 64] [--random] [--no-hf]

Every request is greedy with ``max_tokens`` its drawn length and no stop token, so it generates
exactly that many tokens and the engines can be checked token for token. In one process, each
compiled and run once untimed first:

- ``engine``: the rlx engine as new runs build it off TPU (continuous batching, ``--slots`` decode
  slots, the ``live`` decode attention, shortest prompts admitted first, a group's prompt
  prefilled once and its full pages shared by the samples admitted while the prefilled one runs),
  with a KV pool of the worst case;
- ``no_sharing``: the same with every request prefilled on its own; ``sharing_speedup`` is its
  time over the engine's, ``no_sharing_same_tokens`` whether every completion equals the engine's;
  ``peak_pages_shared`` and ``peak_pages_copied`` are the most KV pages the two held at once;
- ``small_pool``: a KV pool of half the worst case (sequences preempted and recomputed when it
  runs out); ``small_pool_same_tokens`` whether every completion equals the full pool's, and
  ``small_pool_speed_ratio`` its tokens/s over the full pool's;
- ``hf``: Transformers' ``generate`` on the same weights (float32, greedy, left padding, batches of
  ``--slots`` requests in the workload's order, every request of a batch run to the batch's
  longest and only the tokens each asked for counted; torch on every core);
  ``vs_hf`` is the engine's tokens/s over HF's, and ``hf_mismatched`` counts the requests whose HF
  tokens differ from the engine's (float32 sums in another order can turn a near-tie).

Tokens/s counts generated tokens over the wall time of the whole generation, prefills included;
``{name}_steps`` and ``{name}_calls`` are the decode steps and device calls each engine ran.
The last line printed is a JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from runtime.inference import Engine, SamplingParams  # noqa: E402
from runtime.model import Model, ModelConfig  # noqa: E402

PROMPT_TOKENS = (100, 400)
COMPLETION_MEDIAN, COMPLETION_MAX, COMPLETION_SIGMA = 64, 512, 0.8
PAGE_SIZE = 16
SMOLLM2_SHAPE = ModelConfig(vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3,
                            intermediate_size=1536, tie_word_embeddings=True, rope_theta=100000.0,
                            rms_norm_eps=1e-5, max_position_embeddings=8192)


def load_model(random: bool) -> tuple[Model, str]:
    """SmolLM2-135M-Instruct as ``scripts/get_model smollm2`` installed it, else random weights of its shape."""
    if not random:
        from runtime.known_models import imported, known_model, models_dir
        from runtime.model import load_hf

        known = known_model("smollm2")
        path = models_dir() / known.directory
        if imported(known, path):
            return load_hf(str(path)), f"SmolLM2-135M-Instruct ({path})"
    return Model.init(SMOLLM2_SHAPE, key=jax.random.key(0)), "random weights of SmolLM2-135M's shape"


def workload(prompts: int, group: int, vocab: int, seed: int = 0):
    """``prompts`` prompts, each ``group`` times in a row, and each request's greedy params."""
    gen = np.random.default_rng(seed)
    out, params = [], []
    for _ in range(prompts):
        prompt = gen.integers(4, vocab, int(gen.integers(PROMPT_TOKENS[0], PROMPT_TOKENS[1] + 1))).tolist()
        for _ in range(group):
            n = int(min(COMPLETION_MAX, max(1, round(gen.lognormal(np.log(COMPLETION_MEDIAN), COMPLETION_SIGMA)))))
            out.append(prompt)
            params.append(SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    return out, params


BUCKETS = (128, 256, 512)  # the prefill lengths the prompts need


def engine_run(model: Model, prompts, params, *, slots: int, pages: int, share: bool):
    """(seconds, completions, stats) of one engine's generation, after an untimed warm-up that
    compiles every program the timed one uses: a prefill per bucket, a shared prompt's copy, and
    decode calls of every length (requests of 1 to 24 tokens)."""
    max_len = PROMPT_TOKENS[1] + COMPLETION_MAX
    engine = Engine(model, max_slots=slots, page_size=PAGE_SIZE, num_pages=pages + 1, max_seq_len=max_len,
                    prefill_buckets=BUCKETS, attention_impl="live", share_prompts=share, admission="prompt_length")
    gen = np.random.default_rng(1)
    warm = [gen.integers(4, model.config.vocab_size, b).tolist() for b in BUCKETS]
    warm = [p for p in warm for _ in range(2)]  # each twice: the shared prefill's copy
    engine.generate(warm, [SamplingParams(temperature=0.0, max_tokens=1 + 23 * i // (len(warm) - 1), ignore_eos=True)
                           for i in range(len(warm))], list(range(len(warm))))
    seeds = list(range(len(prompts)))
    start = time.perf_counter()
    completions = engine.generate(prompts, params, seeds)
    return time.perf_counter() - start, completions, engine.last_stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--random", action="store_true", help="random weights of SmolLM2's shape")
    parser.add_argument("--no-hf", action="store_true", help="skip Hugging Face generate")
    args = parser.parse_args()

    model, what = load_model(args.random)
    prompts, params = workload(args.prompts, args.group, model.config.vocab_size)
    tokens = sum(p.max_tokens for p in params)
    worst = args.slots * -(-(PROMPT_TOKENS[1] + COMPLETION_MAX) // PAGE_SIZE)
    result: dict = {"model": what, "backend": jax.default_backend(), "cpu": platform.processor() or platform.machine(),
                    "cores": os.cpu_count(), "prompts": args.prompts, "group": args.group, "requests": len(prompts),
                    "slots": args.slots, "generated_tokens": tokens, "kv_pages_worst": worst}
    runs = {}
    for name, pages, share in (("engine", worst, True), ("no_sharing", worst, False), ("small_pool", worst // 2, True)):
        seconds, completions, stats = engine_run(model, prompts, params, slots=args.slots, pages=pages, share=share)
        runs[name] = completions
        result[f"{name}_s"] = seconds
        result[f"{name}_tok_s"] = tokens / seconds
        result[f"{name}_prefills"] = stats.prefills
        result[f"{name}_preemptions"] = stats.preemptions
        result[f"{name}_peak_pages"] = stats.peak_pages
        result[f"{name}_steps"], result[f"{name}_calls"] = stats.steps, stats.decode_calls
        print(json.dumps({k: v for k, v in result.items() if k.startswith(name)}), flush=True)
    result["sharing_speedup"] = result["no_sharing_s"] / result["engine_s"]
    result["peak_pages_shared"], result["peak_pages_copied"] = result["engine_peak_pages"], result["no_sharing_peak_pages"]
    for name in ("small_pool", "no_sharing"):
        result[f"{name}_same_tokens"] = all(
            np.array_equal(a.tokens, b.tokens) for a, b in zip(runs["engine"], runs[name], strict=True))
    result["small_pool_speed_ratio"] = result["small_pool_tok_s"] / result["engine_tok_s"]
    if not args.no_hf:
        import bench_inference
        import torch

        hf = bench_inference.load_hf_model(model)
        torch.set_num_threads(os.cpu_count() or 1)
        seconds, generated, mismatched = bench_inference.hf_generate(hf, prompts, params, args.slots, runs["engine"])
        result.update(hf_s=seconds, hf_tok_s=generated / seconds, hf_mismatched=len(mismatched),
                      vs_hf=(tokens / result["engine_s"]) / (generated / seconds))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
