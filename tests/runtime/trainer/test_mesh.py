"""The train step on a device mesh (``trainer.mesh``), on several CPU devices.

The rules place every parameter and optimizer moment (fsdp splits weights' input dimension,
model splits heads and intermediate units, vectors are replicated, an axis that does not divide a
dimension leaves it whole); a sharded step computes the unsharded step's loss and update to
float32 rounding; a run on a mesh is deterministic for its mesh and replays bit-exactly. A
process has one CPU device unless ``XLA_FLAGS`` says otherwise, so the multi-device checks run in
subprocesses with ``--xla_force_host_platform_device_count``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from ledger import open_store
from runtime.config import ConfigError, MeshShape, load_config
from runtime.errors import UsageError
from runtime.session import trainer_mesh
from tests.runtime.small_run import TINY

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def _python(code: str, devices: int, timeout: int = 600) -> dict:
    """Run ``code`` in a fresh interpreter with ``devices`` CPU devices; its last line as JSON."""
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _step_setup(num_layers: int) -> str:
    """The start of a step test's program: a small model of ``num_layers`` layers, its parameters
    and a packed batch of 16 rows (4 groups)."""
    return """
        import dataclasses, json
        import jax, jax.numpy as jnp, numpy as np
        from kernels.algorithms import configure
        from runtime.config import MeshShape
        from runtime.model import ModelConfig, init_params
        from runtime.trainer import Sample, StepConfig, make_optimizer, pack, train_step
        from runtime.trainer.mesh import make_mesh, shard_rows, shard_tree

        model = ModelConfig(vocab_size=29, hidden_size=32, num_layers=NUM_LAYERS, num_heads=4, num_kv_heads=2,
                            intermediate_size=48, initializer_range=0.3)
        params = init_params(model, key=jax.random.key(0))
        rng = np.random.default_rng(0)
        samples = [Sample(np.int32([1, 5 + i // 4, 7]), np.int32(rng.integers(3, 29, 1 + i % 4)),
                          np.float32(-np.ones(1 + i % 4)), float(i % 3 == 0), 0) for i in range(16)]
        batch = pack(samples, group_size=4, width=8, pad_id=0)
    """.replace("NUM_LAYERS", str(num_layers))


def test_a_mesh_table_names_its_axes_and_sizes():
    assert MeshShape.of({}).size == 1 and MeshShape.of(None).describe() == "one device"
    shape = MeshShape.of({"fsdp": 2, "model": 2})
    assert (shape.shape, shape.size, shape.describe()) == ((1, 2, 2), 4, "fsdp=2×model=2")
    assert load_config(None, ["trainer.mesh={fsdp=2}"]).trainer.mesh == {"fsdp": 2}
    for bad, words in (("{pipeline=2}", "'pipeline'"), ("{fsdp=0}", ">= 1"), ("{fsdp=true}", "integer")):
        with pytest.raises(ConfigError) as e:
            load_config(None, [f"trainer.mesh={bad}"])
        assert "trainer.mesh" in str(e.value) and words in str(e.value) and "\n" not in str(e.value)
    bounded = load_config(None, ["trainer.mesh={fsdp=2}", "trainer.micro_batch_size=4", "trainer.logits_chunk=8",
                                 "trainer.remat=true"])
    assert bounded.trainer.bounded and bounded.trainer.mesh == {"fsdp": 2}
    with pytest.raises(ConfigError, match="a multiple of 4"):  # a micro-batch splits over the row shards
        load_config(None, ["trainer.mesh={data=2,fsdp=2}", "trainer.micro_batch_size=6"])


def test_a_mesh_larger_than_the_process_is_a_one_line_error():
    config = load_config(None, ["trainer.mesh={data=2,fsdp=4}"])
    with pytest.raises(UsageError) as e:
        trainer_mesh(config)
    message = str(e.value)
    assert "needs 8 devices" in message and "xla_force_host_platform_device_count=8" in message
    assert "\n" not in message
    assert trainer_mesh(load_config(None, [])) is None


def test_the_rules_place_every_parameter_and_the_sharded_step_matches_the_unsharded_one():
    got = _python(_step_setup(num_layers=1) + """
        config = StepConfig(model=model, objective=configure("grpo"), group_size=4, share_prefix=True, prefix=3)
        zeros = jnp.zeros(batch.mask_BS.shape, jnp.float32)
        current = jnp.ones((16,), bool)

        def spec(x):  # the axis of each dimension (None: whole), padded to the array's rank
            axes = list(getattr(x.sharding, "spec", ()))
            return axes + [None] * (x.ndim - len(axes))

        def step(mesh):
            p = shard_tree(mesh, jax.tree.map(jnp.array, params))
            o = make_optimizer(config).init(p)
            b, z, c = shard_rows(mesh, (jax.device_put(batch), zeros, current))
            placed = {jax.tree_util.keystr(k): spec(v) for k, v in jax.tree_util.tree_leaves_with_path(p)}
            placed["mu_q"] = spec(o[1][0].mu["layers_0"]["self_attn"]["q_proj"]["kernel"])
            new, opt, metrics = train_step(p, o, b, z, z, c, config=config)
            return new, placed, {k: float(v) for k, v in metrics.items()}

        out = {"devices": jax.device_count()}
        base = step(None)
        for name, table in (("fsdp", {"fsdp": 4}), ("mixed", {"data": 2, "model": 2})):
            mesh = make_mesh(MeshShape.of(table))
            new, specs, metrics = step(mesh)
            out[name] = {
                "specs": specs,
                "loss": [metrics["loss"], base[2]["loss"]],
                "grad_norm": [metrics["grad_norm"], base[2]["grad_norm"]],
                "update": max(float(np.max(np.abs(np.float64(a) - np.float64(b))))
                              for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(base[0]))),
                "moved": max(float(np.max(np.abs(np.float64(a) - np.float64(b))))
                             for a, b in zip(jax.tree.leaves(base[0]), jax.tree.leaves(params))),
                "again": all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(step(mesh)[0]), jax.tree.leaves(new))),
            }
        print(json.dumps(out))
    """, devices=4)
    assert got["devices"] == 4
    fsdp = got["fsdp"]["specs"]
    assert fsdp["['layers_0']['self_attn']['q_proj']['kernel']"] == ['fsdp', None]
    assert fsdp["['layers_0']['mlp']['down_proj']['kernel']"] == [None, 'fsdp']
    assert fsdp["['embed_tokens']['embedding']"] == [None, 'fsdp']
    assert fsdp["['layers_0']['input_layernorm']['scale']"] == [None]
    assert fsdp["['lm_head']['kernel']"] == ['fsdp', None]  # 29 tokens: not split
    mixed = got["mixed"]["specs"]
    assert mixed["['layers_0']['self_attn']['q_proj']['kernel']"] == [None, 'model']
    assert mixed["['layers_0']['self_attn']['o_proj']['kernel']"] == ['model', None]
    assert mixed["['layers_0']['mlp']['up_proj']['kernel']"] == [None, 'model']
    assert fsdp["mu_q"] == ['fsdp', None]  # Adam's moments follow the weights
    for name in ("fsdp", "mixed"):
        r = got[name]
        assert r["loss"][0] == pytest.approx(r["loss"][1], rel=1e-5, abs=1e-6)
        assert r["grad_norm"][0] == pytest.approx(r["grad_norm"][1], rel=1e-5)
        assert r["update"] < 1e-3 * r["moved"]  # the same update up to rounding, against a real step
        assert r["again"]  # the same mesh, the same bits


BOUNDED = ("trainer.micro_batch_size=4", "trainer.logits_chunk=4", "trainer.remat=true")


@pytest.fixture(scope="module", params=[(4, {"data": 2, "model": 2}, ()), (2, {"fsdp": 2}, BOUNDED)],
                ids=["4-data-model", "2-fsdp-bounded"])
def mesh_runs(request, tmp_path_factory) -> dict:
    """Four CPU devices with ``trainer.mesh={data=2,model=2}``, and two with ``{fsdp=2}`` and
    micro-batches, logits chunks and remat (the plain ``{fsdp=2}`` step is compared with the
    unsharded one above): an uninterrupted run of 4 steps, and one killed in its second train step
    and resumed. The tests below check each outcome separately."""
    devices, mesh, bounds = request.param
    tmp = tmp_path_factory.mktemp(f"mesh{devices}{'-bounded' if bounds else ''}")
    table = "{" + ",".join(f"{axis}={n}" for axis, n in mesh.items()) + "}"
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}

    def rlx(*argv, failpoint=None):
        return subprocess.run([sys.executable, "-m", "runtime.cli", *argv], cwd=ROOT, capture_output=True, text=True,
                              env={**env, **({"RLX_FAILPOINTS": failpoint, "RLX_TEST_FAILPOINTS": "1"} if failpoint else {})}, timeout=600)

    def start(out, failpoint=None):
        argv = ["run", "--out", out, "--steps", "4", "--no-progress"]
        for o in [*TINY, "workers.mode=threads", "eval.every_steps=0", f"trainer.mesh={table}", *bounds,
                  f'pretrain.cache_dir="{tmp / "warm"}"']:
            argv += ["--set", o]
        return rlx(*argv, failpoint=failpoint)

    ref, killed = str(tmp / "ref"), str(tmp / "killed")
    first = start(ref)
    assert first.returncode == 0, first.stderr[-2000:]
    kill = start(killed, failpoint="trainer.step@2")
    resumed = rlx("resume", killed, "--no-progress") if kill.returncode == -signal.SIGKILL else None
    return {"devices": devices, "mesh": mesh, "ref": ref, "killed": killed, "kill": kill, "resumed": resumed,
            "rlx": rlx}


@pytest.mark.slow
def test_a_run_on_a_mesh_killed_in_a_step_and_resumed_ends_with_the_uninterrupted_digest(mesh_runs):
    kill, resumed = mesh_runs["kill"], mesh_runs["resumed"]
    assert kill.returncode == -signal.SIGKILL, kill.stderr[-2000:]
    assert resumed is not None and resumed.returncode == 0, resumed.stderr[-2000:]
    digests = [json.load(open(os.path.join(mesh_runs[d], "summary.json")))["final_digest"] for d in ("ref", "killed")]
    assert digests[0] == digests[1]


@pytest.mark.slow
def test_a_run_on_a_mesh_replays_bit_exactly(mesh_runs):
    proc = mesh_runs["rlx"]("replay", mesh_runs["ref"], "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    final = json.load(open(os.path.join(mesh_runs["ref"], "summary.json")))["final_digest"]
    assert report["match"] and report["versions_verified"] == 5 and report["final_digest"] == final
    assert not report["fingerprint_differs"]


@pytest.mark.slow
def test_a_run_on_a_mesh_records_its_mesh_and_device_count(mesh_runs):
    with open_store(mesh_runs["ref"]) as store:
        first = next(iter(store.read("run"))).event
    assert first.config["trainer"]["mesh"] == mesh_runs["mesh"] and first.fingerprint["devices"] == mesh_runs["devices"]


@pytest.mark.slow
def test_a_sharded_step_is_also_memory_bounded_and_its_fixed_order_sum_is_the_same_on_every_layout():
    """``trainer.mesh`` with micro-batches, logits chunks and remat: the step on 4 devices
    equals the unsharded bounded step up to rounding, and with the fixed-order reduction
    ``fsdp=4`` and ``data=2×fsdp=2`` give the same bits (each micro-batch takes its share of every
    row shard, so both split the batch the same way)."""
    got = _python(_step_setup(num_layers=2) + """
        bounded = StepConfig(model=model, objective=configure("grpo"), group_size=4, micro_batch_size=8,
                             logits_chunk=3, remat=True)
        zeros = jnp.zeros(batch.mask_BS.shape, jnp.float32)
        current = jnp.ones((16,), bool)

        def step(table, fixed):
            mesh = make_mesh(MeshShape.of(table)) if table else None
            config = bounded if mesh is None else dataclasses.replace(
                bounded, row_shards=mesh.shape["data"] * mesh.shape["fsdp"], fixed_order_mesh=mesh if fixed else None)
            p = shard_tree(mesh, jax.tree.map(jnp.array, params))
            o = make_optimizer(config).init(p)
            b, z, c = shard_rows(mesh, (jax.device_put(batch), zeros, current))
            new, _, metrics = train_step(p, o, b, z, z, c, config=config)
            return [np.asarray(x) for x in jax.tree.leaves(new)], float(metrics["loss"]), float(metrics["grad_norm"])

        base = step({}, False)
        moved = max(float(np.max(np.abs(np.float64(a) - np.float64(b)))) for a, b in zip(base[0], jax.tree.leaves(params)))
        out = {"moved": moved}
        for name, table, fixed in (("gspmd", {"fsdp": 4}, False), ("fixed_fsdp", {"fsdp": 4}, True),
                                   ("fixed_mixed", {"data": 2, "fsdp": 2}, True)):
            new, loss, norm = step(table, fixed)
            out[name] = {"update": max(float(np.max(np.abs(np.float64(a) - np.float64(b)))) for a, b in zip(new, base[0])),
                         "loss": [loss, base[1]], "grad_norm": [norm, base[2]], "leaves": [x.tolist() for x in new[:3]]}
        out["fixed_same_bits"] = out["fixed_fsdp"]["leaves"] == out["fixed_mixed"]["leaves"]
        print(json.dumps({k: ({kk: vv for kk, vv in v.items() if kk != "leaves"} if isinstance(v, dict) else v)
                          for k, v in out.items()}))
    """, devices=4)
    for name in ("gspmd", "fixed_fsdp", "fixed_mixed"):
        r = got[name]
        assert r["loss"][0] == pytest.approx(r["loss"][1], rel=1e-5, abs=1e-6)
        assert r["grad_norm"][0] == pytest.approx(r["grad_norm"][1], rel=1e-5)
        # the same update up to rounding (Adam divides each gradient by its own size, so a near-zero
        # gradient's rounding can move its weight by a visible fraction of the step)
        assert r["update"] < 1e-2 * got["moved"], (name, r)
    assert got["fixed_same_bits"]
