#!/usr/bin/env python
"""What a user's reward function (``verifier.reward``) costs in the code sandbox, per completion.

    python scripts/bench_reward.py [--batch 256] [--repeats 7] [--slots 4] [--isolation auto]

Scores batches of ``--batch`` arithmetic completions (the demo's batch: 32 groups of 8) with
``configs/example_reward.py`` three ways, each ``--repeats`` times, and reports the median per
completion: in the sandbox as a run does (``verifiers.reward.RewardVerifier``: one sandboxed
process per share of the batch, one call per completion), the same function called in this
process (what skipping the sandbox would cost), and the math verifier the task scores with when
no reward is given (``verifiers.math.verify_math``). ``sandbox_over_math`` is the ratio of the
medians. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.tasks import make_task  # noqa: E402
from verifiers.code import Sandbox  # noqa: E402
from verifiers.math import verify_math  # noqa: E402
from verifiers.reward import RewardModule, RewardVerifier  # noqa: E402

EXAMPLE = ROOT / "configs" / "example_reward.py"


def items(batch: int) -> list[tuple[str, str, str | None]]:
    """``batch`` arithmetic problems, each with a right, a wrong or a wordy completion."""
    task = make_task("arithmetic", seed=0)
    out: list[tuple[str, str, str | None]] = []
    for i in range(batch):
        p = task.problem("train", i)
        assert p.answer is not None
        completion = (p.answer, str(int(p.answer) + 1), f"it is {p.answer}")[i % 3]
        out.append((p.prompt, completion, p.answer))
    return out


def per_completion(fn, batch: list, repeats: int) -> float:
    """Median seconds per completion of ``fn(batch)`` over ``repeats`` timed calls (after one warm-up)."""
    fn(batch)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(batch)
        times.append((time.perf_counter() - start) / len(batch))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--isolation", default="auto")
    args = parser.parse_args()

    module = RewardModule.load(str(EXAMPLE))
    namespace: dict = {}
    exec(compile(module.source, module.path, "exec"), namespace)  # the in-process baseline only
    reward = namespace[module.function]
    batch = items(args.batch)
    with Sandbox(args.isolation, slots=args.slots) as sandbox:
        verifier = RewardVerifier(module, sandbox)
        rewards = [o.reward for o in verifier.score(batch)]
        assert rewards == [reward(*item) for item in batch], "the sandbox and this process disagree"
        sandboxed = per_completion(verifier.score, batch, args.repeats)
        one = per_completion(verifier.score, batch[:1], args.repeats)
        level = sandbox.level.value
    inprocess = per_completion(lambda b: [reward(*item) for item in b], batch, args.repeats)
    math = per_completion(lambda b: [verify_math(answer, completion) for _, completion, answer in b], batch,
                          args.repeats)
    result = {
        "batch": args.batch,
        "slots": args.slots,
        "isolation": level,
        "sandbox_ms_per_completion": round(sandboxed * 1e3, 4),
        "sandbox_ms_one_completion_batch": round(one * 1e3, 3),
        "inprocess_ms_per_completion": round(inprocess * 1e3, 5),
        "math_ms_per_completion": round(math * 1e3, 4),
        "sandbox_over_math": round(sandboxed / math, 3),
    }
    print(f"per completion, batch of {args.batch}: sandboxed reward {result['sandbox_ms_per_completion']} ms "
          f"({level}, {args.slots} slots), in process {result['inprocess_ms_per_completion']} ms, math verifier "
          f"{result['math_ms_per_completion']} ms; a batch of one {result['sandbox_ms_one_completion_batch']} ms")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
