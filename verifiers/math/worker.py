"""The math judging process: JSON requests on stdin, JSON outcomes on stdout, one per line.

Started by ``pool.MathVerifier`` as ``python -m verifiers.math.worker``; it caps its own address
space, warms up the parsers, says ``"ready"`` and then judges until stdin closes.
"""

from __future__ import annotations

import json
import resource
import sys

MEMORY_BYTES = 2 << 30


def main() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    sys.setrecursionlimit(5_000)
    from verifiers.math.judge import MathConfig, judge_math

    judge_math("1", "1")  # import math-verify and warm sympy before the first deadline runs
    judge_math("x", "x+0")
    out = sys.stdout
    out.write('"ready"\n')
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        config = MathConfig(
            extract=request["extract"], rel_tol=request["rel_tol"], abs_tol=request["abs_tol"]
        )
        try:
            result = judge_math(request["gold"], request["response"], config).to_dict()
        except MemoryError:
            result = {"error": "the expression exhausted the judge's memory"}
        except RecursionError:
            result = {"error": "the expression nests too deeply"}
        out.write(json.dumps(result) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
