#!/usr/bin/env python
"""KV pages a group's shared prompt saves: the most pages in use at once when a group's samples
reference their prompt's full pages, against each sample holding its own (``share_prompts=False``:
the pages a copy of the prompt per sample takes).

Usage: python scripts/bench_prompt_sharing.py [--prompts 4] [--group 8] [--page-size 16]

Prompts of 290–310 tokens, each sampled by ``--group`` greedy requests of log-normal completion
lengths (median 64, at most 512) with no stop token, all admitted at once (one slot each) into a
pool of the worst case. Which pages a request holds depends only on lengths, so a small random
model gives the figures of any model; the completions of the two engines are checked equal bit
for bit. The last line printed is a JSON object: ``peak_pages_shared``, ``peak_pages_copied``
and their ratio, ``prompt_pages`` (the pages of the prompts themselves, once).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runtime.inference import Engine, SamplingParams  # noqa: E402
from runtime.inference.pages import pages_for  # noqa: E402
from runtime.model import Model, ModelConfig  # noqa: E402

PROMPT_TOKENS = (290, 310)
COMPLETION_MEDIAN, COMPLETION_MAX, COMPLETION_SIGMA = 64, 512, 0.8
SMALL = ModelConfig(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                    intermediate_size=128, max_position_embeddings=1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--page-size", type=int, default=16)
    args = parser.parse_args()

    gen = np.random.default_rng(0)
    prompts, params = [], []
    for _ in range(args.prompts):
        prompt = gen.integers(4, SMALL.vocab_size, int(gen.integers(PROMPT_TOKENS[0], PROMPT_TOKENS[1] + 1))).tolist()
        for _ in range(args.group):
            n = int(min(COMPLETION_MAX, max(1, round(gen.lognormal(np.log(COMPLETION_MEDIAN), COMPLETION_SIGMA)))))
            prompts.append(prompt)
            params.append(SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    slots = len(prompts)
    max_len = PROMPT_TOKENS[1] + COMPLETION_MAX
    worst = slots * pages_for(max_len, args.page_size)
    model = Model.init(SMALL, key=jax.random.key(0))
    result: dict = {"prompts": args.prompts, "group": args.group, "page_size": args.page_size, "requests": slots,
                    "prompt_tokens": sum(len(prompts[i * args.group]) for i in range(args.prompts)),
                    "prompt_pages": sum(pages_for(len(prompts[i * args.group]), args.page_size)
                                        for i in range(args.prompts)),
                    "kv_pages_worst": worst}
    outs = {}
    for name, share in (("shared", True), ("copied", False)):
        engine = Engine(model, max_slots=slots, page_size=args.page_size, num_pages=worst + 1, max_seq_len=max_len,
                        prefill_buckets=(512,), share_prompts=share)
        outs[name] = engine.generate(prompts, params, list(range(slots)))
        stats = engine.last_stats
        assert stats is not None
        result[f"peak_pages_{name}"] = stats.peak_pages
        result[f"prefills_{name}"] = stats.prefills
        print(json.dumps({k: v for k, v in result.items() if k.endswith(name)}), flush=True)
    result["peak_pages_ratio"] = result["peak_pages_copied"] / result["peak_pages_shared"]
    result["same_bits"] = all(a.tokens.tobytes() == b.tokens.tobytes() and a.logprobs.tobytes() == b.logprobs.tobytes()
                              for a, b in zip(outs["shared"], outs["copied"], strict=True))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
