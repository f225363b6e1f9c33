"""Loss + gradient time per token of every objective, beside a plain masked-mean REINFORCE.

    .venv/bin/python scripts/bench_objectives.py [--batch 256] [--width 1024] [--repeats 20]

Each objective is ``jit(value_and_grad(loss))`` on the same random batch (right-padded rows of
random length, NaN in the padding), timed twice: loss and gradient alone (the metrics are not
returned, so XLA drops them), and loss, gradient and metrics. The baseline is the cheapest loss
one could write, ``-Σ where(m, A ℓ, 0) / Σ m``, and its gradient. Times are the fastest of
``--repeats`` calls, taken in ``--rounds`` interleaved rounds so that a burst of load on a shared
machine hits every objective alike. The last line is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from kernels.algorithms import POLICY_ALGORITHMS
from kernels.objectives import configure, policy_loss, preference_loss


def make_batch(batch: int, width: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(width // 4, width + 1, size=batch)
    mask = np.arange(width)[None, :] < lengths[:, None]
    logp_old = -rng.exponential(1.0, (batch, width)).astype(np.float32)
    logp = logp_old + rng.normal(0.0, 0.1, (batch, width)).astype(np.float32)
    logp_ref = logp_old + rng.normal(0.0, 0.1, (batch, width)).astype(np.float32)
    pad = lambda x: jnp.asarray(np.where(mask, x, np.nan))  # noqa: E731
    return dict(logp=pad(logp), logp_old=pad(logp_old), logp_ref=pad(logp_ref),
                advantages=jnp.asarray(rng.normal(size=batch).astype(np.float32)),
                mask=jnp.asarray(mask))


def baseline(logp, logp_old, logp_ref, advantages, mask):
    del logp_old, logp_ref
    total = jnp.sum(jnp.where(mask, advantages[:, None] * logp, 0.0))
    return -total / jnp.sum(mask), {}


def timed(fn, data: dict, repeats: int) -> float:
    """Fastest of ``repeats`` calls after compilation, in seconds.

    The minimum rather than the median: on a shared machine other processes only ever add time.
    """
    jax.block_until_ready(fn(**data))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(**data))
        samples.append(time.perf_counter() - start)
    return min(samples)


def gradient_step(loss_fn, with_metrics: bool):
    def step(logp, **rest):
        def loss(lp):
            value, metrics = loss_fn(logp=lp, **rest)
            return (value, metrics) if with_metrics else value

        return jax.value_and_grad(loss, has_aux=with_metrics)(logp)

    return jax.jit(step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    data = make_batch(args.batch, args.width)
    tokens = args.batch * args.width
    preference = {k: v for k, v in data.items() if k not in ("logp_old", "advantages")}
    labels = jnp.arange(args.batch) % 2 == 0

    losses = {"baseline_reinforce": (baseline, data)}
    for name in POLICY_ALGORITHMS:
        options = dict(max_length=args.width) if name == "drgrpo" else {}
        config = configure(name, **options)
        losses[name] = (lambda config=config, **kw: policy_loss(config, **kw), data)
    losses["dpo"] = (lambda **kw: preference_loss("dpo", **kw), preference)
    losses["kto"] = (
        lambda **kw: preference_loss("kto", desirable=labels, reference_point=0.0, **kw),
        preference,
    )
    steps = {
        (name, metrics): (gradient_step(fn, metrics), inputs)
        for name, (fn, inputs) in losses.items()
        for metrics in (False, True)
    }
    best = {key: float("inf") for key in steps}
    for _ in range(args.rounds):
        for key, (step, inputs) in steps.items():
            best[key] = min(best[key], timed(step, inputs, args.repeats))

    base = best[("baseline_reinforce", False)]
    print(f"{'objective':<20}{'loss+grad ms':>14}{'ns/token':>10}{'vs base':>9}"
          f"{'+metrics ms':>13}{'vs base':>9}")
    for name in losses:
        plain, full = best[(name, False)], best[(name, True)]
        print(f"{name:<20}{plain * 1e3:>14.3f}{plain / tokens * 1e9:>10.3f}{plain / base:>8.2f}x"
              f"{full * 1e3:>13.3f}{full / base:>8.2f}x")
    ns = lambda metrics: {  # noqa: E731
        name: round(best[(name, metrics)] / tokens * 1e9, 4) for name in losses
    }
    ratio = lambda metrics: {  # noqa: E731
        name: round(best[(name, metrics)] / base, 3) for name in losses
    }
    summary = {
        "batch": args.batch,
        "width": args.width,
        "tokens": tokens,
        "platform": jax.devices()[0].platform,
        "ns_per_token_loss_grad": ns(False),
        "ratio_to_baseline_loss_grad": ratio(False),
        "ns_per_token_with_metrics": ns(True),
        "ratio_to_baseline_with_metrics": ratio(True),
        "max_ratio_policy_loss_grad": max(ratio(False)[k] for k in POLICY_ALGORITHMS),
        "target_max_ratio": 1.5,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
