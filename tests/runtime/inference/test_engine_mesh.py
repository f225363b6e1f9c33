"""The engine on a device mesh (``inference.mesh={model=N}``): weights split by heads and MLP
units, the KV cache by kv heads, over N CPU devices (subprocesses with
``--xla_force_host_platform_device_count``, which must be set before JAX starts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from runtime.config import ConfigError, load_config
from runtime.errors import UsageError
from runtime.session import EngineShape
from tests.runtime.small_run import TINY

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def _env(devices: int) -> dict[str, str]:
    return {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
            "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_an_engine_mesh_is_configured_with_one_line_errors():
    assert load_config(None, ["inference.mesh={model=2}"]).inference.mesh == {"model": 2}
    for bad, words in (("{data=2}", "over model only"), ("{model=0}", ">= 1"), ("{heads=2}", "'heads'")):
        with pytest.raises(ConfigError) as e:
            load_config(None, [f"inference.mesh={bad}"])
        assert "inference.mesh" in str(e.value) and words in str(e.value) and "\n" not in str(e.value)
    shape = EngineShape(slots=2, page_size=4, pages_per_seq=2, buckets=(4,), model_devices=8)
    with pytest.raises(UsageError, match="inference.mesh model=8 needs 8 devices"):
        shape.build(None)
    assert EngineShape.recorded({"max_slots": 2, "page_size": 4, "max_seq_len": 8, "prefill_buckets": [4],
                                 "mesh": {"model": 2}}).model_devices == 2


ENGINE_ON_TWO = """
    import json, numpy as np, jax
    from runtime.config import MeshShape
    from runtime.inference import Engine, SamplingParams
    from runtime.trainer.mesh import make_mesh
    from tests.runtime.inference.conftest import ENGINE, widened_model
    from tests.runtime.inference.test_engine import WORKLOAD

    model = widened_model()
    one = Engine(model, **ENGINE, attention_impl="live")
    two = Engine(model, **ENGINE, attention_impl="live", mesh=make_mesh(MeshShape(model=2)))
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kw: compiles.append(event) if event.startswith("/jax/core/compile") else None)
    prompts, params, seeds = WORKLOAD
    alone = [two.generate([p], [q], [s])[0] for p, q, s in zip(prompts, params, seeds)]
    batch = two.generate(prompts[::-1], params[::-1], seeds[::-1])[::-1]
    picks = [0, 3, 0, 3, 0]  # one prompt three times, another twice: prefilled once each, copied for the rest
    grouped = two.generate([prompts[i] for i in picks], [params[i] for i in picks], [seeds[i] for i in picks])
    copies = two.last_stats.prefill_copies
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    g1, g2 = one.generate(prompts[:4], greedy, [0, 1, 2, 3]), two.generate(prompts[:4], greedy, [0, 1, 2, 3])
    two.update_params(model.params)
    again = two.generate(prompts[:3], params[:3], seeds[:3])
    bits = lambda c: (c.tokens.tolist(), c.logprobs.tobytes().hex())
    print(json.dumps({
        "batch_invariant": [bits(a) == bits(b) for a, b in zip(alone, batch)],
        "grouped_as_alone": [bits(c) == bits(alone[i]) for c, i in zip(grouped, picks)],
        "prefill_copies": copies,
        "after_new_weights": [bits(a) == bits(b) for a, b in zip(again, alone[:3])],
        "greedy_tokens_as_one_device": [a.tokens.tolist() == b.tokens.tolist() for a, b in zip(g1, g2)],
        "greedy_logprob_diff": max(float(np.max(np.abs(a.logprobs - b.logprobs))) for a, b in zip(g1, g2)),
        "compiles_after_build": len(compiles),
        "recorded": two.batch_shape["mesh"],
        "down_proj": str(two._params["layers_0"]["mlp"]["down_proj"]["kernel"].sharding.spec),
        "k_pages": str(two._cache.k_pages[0].sharding.spec),
        "devices": len(two._cache.k_pages[0].sharding.device_set),
    }), flush=True)
"""


@pytest.mark.slow
def test_an_engine_split_over_two_devices_is_batch_invariant_and_agrees_with_one():
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(ENGINE_ON_TWO)], cwd=ROOT, env=_env(2),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(got["batch_invariant"]) and len(got["batch_invariant"]) == 12
    assert all(got["grouped_as_alone"]) and len(got["grouped_as_alone"]) == 5 and got["prefill_copies"] >= 1
    assert all(got["after_new_weights"]) and all(got["greedy_tokens_as_one_device"])
    assert got["greedy_logprob_diff"] < 1e-5
    assert got["compiles_after_build"] == 0
    assert got["recorded"] == {"model": 2} and got["devices"] == 2
    assert got["down_proj"] == "P('model', None)" and got["k_pages"] == "P('model',)"


@pytest.mark.slow
def test_a_run_with_a_split_engine_records_its_mesh_and_regenerates_bit_exactly(tmp_path):
    out = str(tmp_path / "run")
    argv = [sys.executable, "-m", "runtime.cli", "run", "--out", out, "--steps", "3", "--no-progress"]
    for o in [*TINY, "workers.mode=threads", "eval.every_steps=0", "inference.mesh={model=2}",
              f'pretrain.cache_dir="{tmp_path / "warm"}"']:
        argv += ["--set", o]
    proc = subprocess.run(argv, cwd=ROOT, env=_env(2), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    replay = subprocess.run([sys.executable, "-m", "runtime.cli", "replay", out, "--regenerate", "--json"], cwd=ROOT,
                            env=_env(2), capture_output=True, text=True, timeout=600)
    assert replay.returncode == 0, replay.stderr[-3000:]
    report = json.loads(replay.stdout.strip().splitlines()[-1])
    digest = json.load(open(os.path.join(out, "summary.json")))["final_digest"]
    assert report["match"] and report["final_digest"] == digest
    from ledger import open_store

    with open_store(out) as store:
        events = [r.event for r in store.read("run")]
    assert events[0].config["inference"]["mesh"] == {"model": 2}
    joins = [e for e in events if type(e).__name__ == "WorkerJoined" and e.role == "inference"]
    assert joins and all(j.info["engine"]["mesh"] == {"model": 2} for j in joins)
