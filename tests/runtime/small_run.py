"""One small real run shared by the replay and audit tests: 3 steps of a tiny model on two-digit
sums (JSONL data), deterministic mode, max_staleness 1, keep_newest 1 (resolved to 2), the
roles as threads (the process roles have their own tests, in ``tests/runtime/service``)."""

from __future__ import annotations

import json

from runtime.config import Config

STEPS = 3
SEED = 1
TINY = [
    "pretrain.steps=20",
    "eval.size=16",
    "scheduling.groups_per_batch=4",
    "sampling.group_size=4",
    "workers.inference_slots=16",
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=64",
]
"""``--set`` overrides of a tiny run of the built-in task (for tests that run ``rlx run`` as a command)."""


def write_sums(path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                     for a in range(5) for b in range(5))


def tiny_config(data: str, cache_dir: str) -> Config:
    return Config.from_dict({
        "run": {"steps": STEPS, "seed": SEED},
        "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64},
        "pretrain": {"steps": 200, "batch_size": 32, "cache_dir": cache_dir},
        "eval": {"size": 4},
        "data": {"task": "jsonl", "path": data, "eval_fraction": 0.2},
        "sampling": {"group_size": 4, "max_tokens": 4},
        "scheduling": {"groups_per_batch": 2, "max_staleness": 1},
        "trainer": {"learning_rate": 1e-2},
        "workers": {"inference_slots": 8, "mode": "threads"},
        "params": {"keep_newest": 1},
    })
