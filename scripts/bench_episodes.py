#!/usr/bin/env python
"""What keeping an episode's KV pages between turns saves: multi-turn episodes sampled three ways
on SmolLM2-135M-Instruct's weights (from ``scripts/get_model smollm2``; random weights of its
shape with ``--random`` or where it is not installed).

Usage: python scripts/bench_episodes.py [--episodes 32] [--slots 16] [--turns 3] [--repeats 3] [--random]

Each episode has a prompt of 60–120 ids and ``--turns`` turns of 8–32 sampled ids (greedy, no stop
id, so every variant samples the same lengths); after each turn but the last, 16–32 ids are
appended (a tool result in its template's markers). In one process, each compiled and run once
untimed first, then timed ``--repeats`` times, alternating:

- ``kept``: what runs use (``EpisodeSampler``'s way): one ``generate`` whose ``then`` continues
  each episode in its slot, on its pages, feeding the appended ids through the decode step;
  episodes enter and leave slots as they end;
- ``refed``: no pages kept, turn by turn: each turn one ``generate`` over every episode, each a
  fresh request that prefills the prompt and feeds every id after it again (``feeds``). Its
  episodes are checked equal to ``kept``'s, bit for bit (``same_bits``);
- ``prefilled``: how episodes were sampled before pages were kept: each turn one ``generate``
  whose prompts are the whole episodes so far, prefilled (at buckets up to the longest episode).
  Its bits differ (a prefill-written key is not a decode-written one), so only its time counts.

The figures are medians over the repeats of the whole sampling's wall time: ``kept_s``,
``refed_s``, ``prefilled_s``, and ``speedup_vs_refed`` / ``speedup_vs_prefilled`` (the other's
time over ``kept``'s). ``fed_tokens`` counts the ids each way feeds through the decode step. The
last line printed is a JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_engine import load_model  # noqa: E402

from runtime.inference import Completion, Continuation, Engine, SamplingParams  # noqa: E402
from runtime.inference.engine import default_buckets  # noqa: E402
from runtime.session import fingerprint  # noqa: E402

PAGE_SIZE = 16
PROMPT, SAMPLED, APPENDED = (60, 120), (8, 32), (16, 32)


@dataclasses.dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    turn_lengths: list[list[int]]  # per episode, each turn's sampled ids
    appended: list[list[list[int]]]  # per episode, the ids appended after each turn but the last

    def params(self, episode: int, turn: int) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=self.turn_lengths[episode][turn], ignore_eos=True)

    def longest(self) -> int:
        return max(len(p) + sum(t) + sum(map(len, a))
                   for p, t, a in zip(self.prompts, self.turn_lengths, self.appended, strict=True))


def workload(episodes: int, turns: int, vocab: int, seed: int = 0) -> Workload:
    gen = np.random.default_rng(seed)

    def ids(bounds: tuple[int, int]) -> list[int]:
        return gen.integers(4, vocab, int(gen.integers(bounds[0], bounds[1] + 1))).tolist()

    return Workload([ids(PROMPT) for _ in range(episodes)],
                    [[int(gen.integers(SAMPLED[0], SAMPLED[1] + 1)) for _ in range(turns)] for _ in range(episodes)],
                    [[ids(APPENDED) for _ in range(turns - 1)] for _ in range(episodes)])


def kept(engine: Engine, w: Workload) -> tuple[list[list[Completion]], int]:
    """Each episode's turns, and the ids fed through the decode step."""
    turns: list[list[Completion]] = [[] for _ in w.prompts]

    def then(i: int, turn: Completion) -> Continuation | None:
        turns[i].append(turn)
        k = len(turns[i])
        if k == len(w.turn_lengths[i]):
            return None
        return Continuation(w.appended[i][k - 1], w.params(i, k), 0)

    engine.generate(w.prompts, [w.params(i, 0) for i in range(len(w.prompts))], [0] * len(w.prompts), then=then)
    assert engine.last_stats is not None
    return turns, engine.last_stats.fed_tokens


def turn_by_turn(engine: Engine, w: Workload, *, prefill: bool) -> tuple[list[list[Completion]], int]:
    """Each episode's turns, and the ids fed through the decode step."""
    n, fed = len(w.prompts), 0
    turns: list[list[Completion]] = [[] for _ in range(n)]
    after: list[list[int]] = [[] for _ in range(n)]  # each episode's ids after its prompt so far
    for k in range(len(w.turn_lengths[0])):
        params = [w.params(i, k) for i in range(n)]
        if prefill:
            done = engine.generate([w.prompts[i] + after[i] for i in range(n)], params, [0] * n)
        else:
            done = engine.generate(w.prompts, params, [0] * n, feeds=after)
        assert engine.last_stats is not None
        fed += engine.last_stats.fed_tokens
        for i, c in enumerate(done):
            turns[i].append(c)
            after[i] = after[i] + c.tokens.tolist() + (w.appended[i][k] if k < len(w.appended[i]) else [])
    return turns, fed


def same_bits(a: list[list[Completion]], b: list[list[Completion]]) -> bool:
    return all(x.tokens.tobytes() == y.tokens.tobytes() and x.logprobs.tobytes() == y.logprobs.tobytes()
               for ea, eb in zip(a, b, strict=True) for x, y in zip(ea, eb, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--random", action="store_true", help="random weights of SmolLM2-135M's shape")
    args = parser.parse_args()

    model, source = load_model(args.random)
    w = workload(args.episodes, args.turns, model.config.vocab_size)
    width = w.longest()
    pages = args.slots * -(-width // PAGE_SIZE)
    engine = Engine(model, max_slots=args.slots, page_size=PAGE_SIZE, num_pages=pages + 1, max_seq_len=width + 1,
                    prefill_buckets=default_buckets(width), attention_impl="live")
    ways = {"kept": lambda: kept(engine, w), "refed": lambda: turn_by_turn(engine, w, prefill=False),
            "prefilled": lambda: turn_by_turn(engine, w, prefill=True)}
    results = {name: way() for name, way in ways.items()}  # compiled and warm
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, way in ways.items():
            start = time.perf_counter()
            way()
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(t) for name, t in times.items()}
    result = {
        "model": source,
        "machine": f"{fingerprint()['cpu']}, {fingerprint()['cores']} cores",
        "episodes": args.episodes, "slots": args.slots, "turns": args.turns, "repeats": args.repeats,
        "sampled_tokens": sum(map(sum, w.turn_lengths)),
        "appended_tokens": sum(len(a) for e in w.appended for a in e),
        "kept_s": round(median["kept"], 3), "refed_s": round(median["refed"], 3),
        "prefilled_s": round(median["prefilled"], 3),
        "speedup_vs_refed": round(median["refed"] / median["kept"], 3),
        "speedup_vs_prefilled": round(median["prefilled"] / median["kept"], 3),
        "fed_tokens": {name: fed for name, (_, fed) in results.items()},
        "same_bits": same_bits(results["kept"][0], results["refed"][0]),
        "times": {name: [round(t, 3) for t in ts] for name, ts in times.items()},
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
