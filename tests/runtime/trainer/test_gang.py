"""A trainer gang (``workers.trainer_processes``): P processes joined with ``jax.distributed``
(gloo on loopback) that train as one trainer.

Each rank writes its own shards of a version and rank 0 publishes the manifest; a gang of 2
processes × 1 device gives the bits of one process with 2 devices; killing one rank mid-run
restarts the whole gang, which ends with the uninterrupted digest and a clean audit.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from ledger import open_store
from runtime.config import ConfigError, load_config
from runtime.errors import UsageError
from runtime.trainer.gang import GangSpec
from tests.runtime.small_run import TINY

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def _env(devices: int = 1, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "RLX_FAILPOINTS")}
    if devices > 1:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return {**env, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gang_of(code: str, processes: int, devices: int, *args: str) -> list[dict]:
    """Run ``code`` as ranks 0..``processes``-1 of a gang (argv: processes, rank, a free
    coordinator port, then ``args``), each with ``devices`` CPU devices; each rank's last line as
    JSON."""
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(processes), str(rank), str(port),
                               *args], cwd=ROOT, env=_env(devices), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for rank in range(processes)]
    outs = [proc.communicate(timeout=600) for proc in procs]
    for proc, (_, stderr) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, stderr[-3000:]
    return [json.loads(stdout.strip().splitlines()[-1]) for stdout, _ in outs]


def test_a_gang_is_configured_with_one_line_errors():
    config = load_config(None, ["workers.trainer_processes=2", "trainer.mesh={fsdp=2}"])
    assert config.workers.trainer_processes == 2
    for overrides, words in (
        (["workers.trainer_processes=2", "trainer.mesh={fsdp=2}", 'workers.mode="threads"'], 'workers.mode="processes"'),
        (["workers.trainer_processes=2", "trainer.mesh={fsdp=3}"], "a multiple of 2"),
        (["workers.trainer_processes=2"], "trainer.mesh={fsdp=2}"),
        (["workers.trainer_processes=0"], ">= 1"),
        (["trainer.mesh={fsdp=2,model=2}", "trainer.deterministic_reduction=true"], "model=1"),
        (["workers.trainer_processes=1000", "trainer.mesh={fsdp=1000}"], "<= 64"),
    ):
        with pytest.raises(ConfigError) as e:
            load_config(None, overrides)
        assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert GangSpec.parse("1/2", "127.0.0.1:7100") == GangSpec(1, 2, "127.0.0.1:7100")
    for gang, coordinator, words in (("2/2", "h:1", "0 <= RANK < SIZE"), ("a/b", "h:1", "RANK/SIZE"),
                                     ("0/2", None, "--coordinator None"), ("0/2", "host", "HOST:PORT")):
        with pytest.raises(UsageError, match=words):
            GangSpec.parse(gang, coordinator)


def test_a_gang_flag_on_another_role_is_refused():
    proc = subprocess.run([sys.executable, "-m", "runtime.cli", "worker", "inference", "--controller", "127.0.0.1:1",
                           "--gang", "0/2", "--coordinator", "127.0.0.1:2"], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--gang is for trainer workers, not 'inference'" in proc.stderr
    assert "Traceback" not in proc.stderr


STORE_RANK = """
    import json, sys
    processes, rank, port, url = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    from runtime.trainer.gang import Gang, GangSpec
    gang = Gang.join(GangSpec(rank, processes, f"127.0.0.1:{port}"))
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from runtime.params import ParamStore
    from runtime.params.digest import params_digest
    from runtime.trainer.mesh import place, to_host

    mesh = Mesh(np.array(jax.devices()), ("fsdp",))
    host = {"w": np.arange(64, dtype=np.float32).reshape(8, 8), "b": np.arange(3, dtype=np.float32),
            "e": np.arange(48, dtype=np.float32).reshape(6, 8) * 0.5}
    specs = {"w": P("fsdp"), "b": P(), "e": P(None, "fsdp")}
    tree = {k: place(v, NamedSharding(mesh, specs[k])) for k, v in host.items()}
    opt = {"m": place(host["w"] * 2, NamedSharding(mesh, P("fsdp")))}
    if rank == 0:
        ParamStore.open(url, create=True)
    gang.barrier("created")
    store = ParamStore.open(url, pack_below=64)  # "b" packed, "w", "e" and "m" arrays of their own
    digest = store.put(3, tree, opt, gang=gang)
    again = store.put(3, tree, opt, gang=gang)  # a retried step: a no-op with the same digest
    gang.barrier("put")
    back = store.get(3)
    print(json.dumps({
        "digest": digest, "again": again, "expected": params_digest(host),
        "equal": all(bool((back[k] == host[k]).all()) for k in host),
        "opt_equal": bool((store.get_opt_state(3)["m"] == host["w"] * 2).all()),
        "to_host": bool((to_host(tree["w"]) == host["w"]).all()),
        "rows": [s.index[0].start for s in tree["w"].addressable_shards],
    }), flush=True)
    gang.shutdown()
"""


def test_each_rank_writes_its_own_shards_and_rank_0_publishes(tmp_path):
    outs = _gang_of(STORE_RANK, 2, 1, (tmp_path / "params").as_uri())
    assert [o["rows"] for o in outs] == [[0], [4]]  # each rank holds half of the rows
    for o in outs:
        assert o["digest"] == o["again"] == o["expected"] and o["equal"] and o["opt_equal"] and o["to_host"]
    data = next((tmp_path / "params").glob("v3/*"))
    # a chunk per shard, each written by the rank that holds it; the replicated vector in the pack
    assert sorted(p.name for p in (data / "params" / "w").glob("c.*")) == ["c.0.0", "c.1.0"]
    assert sorted(p.name for p in (data / "params" / "e").glob("c.*")) == ["c.0.0", "c.0.1"]
    assert sorted(p.name for p in (data / "opt_state" / "m").glob("c.*")) == ["c.0.0", "c.1.0"]
    assert not (data / "params" / "b").exists() and (data / "packed" / "params").is_dir()
    assert (tmp_path / "params" / "manifests" / "v3.json").is_file()


def _run(out: str, overrides: list[str], *, devices: int = 1, failpoints: str | None = None) -> subprocess.Popen:
    argv = [sys.executable, "-m", "runtime.cli", "run", "--out", out, "--steps", "4", "--no-progress"]
    for o in [*TINY, "eval.every_steps=0", "trainer.mesh={fsdp=2}", *overrides]:
        argv += ["--set", o]
    env = _env(devices, **({"RLX_FAILPOINTS": failpoints, "RLX_TEST_FAILPOINTS": "1"} if failpoints else {}))
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finished(proc: subprocess.Popen, out: str, timeout_s: float = 600) -> None:
    """Wait for the run in ``out`` to exit 0; if it does not within ``timeout_s``, stop it and fail
    with what its supervisor journal and each worker's log ended with (where it was stuck)."""
    try:
        code = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, stderr = proc.communicate()
        tails = [f"rlx run's stderr: {stderr[-1500:]}"]
        logs = os.path.join(out, "logs")  # a run in threads mode has neither journal nor logs
        paths = [os.path.join(out, "workers.jsonl"),
                 *(os.path.join(logs, n) for n in sorted(os.listdir(logs) if os.path.isdir(logs) else []))]
        for path in filter(os.path.isfile, paths):
            with open(path, encoding="utf-8", errors="replace") as f:
                tails.append(f"{os.path.basename(path)}: {f.read()[-1200:]}")
        pytest.fail(f"the run in {out} did not finish within {timeout_s:.0f} s:\n" + "\n".join(tails))
    assert code == 0, proc.communicate()[1][-3000:]


def _spawns(out: str) -> list[dict]:
    try:
        with open(os.path.join(out, "workers.jsonl"), encoding="utf-8") as f:
            return [e for e in map(json.loads, f) if e["event"] == "spawn" and e["role"] == "trainer"]
    except FileNotFoundError:
        return []


@pytest.fixture(scope="module")
def gang_runs(tmp_path_factory) -> dict:
    """``trainer.mesh={fsdp=2}``: one process with 2 devices (threads), and a gang of 2 processes
    whose rank 1 is killed while the gang is in its 3rd step (both ranks held there by a
    failpoint). Each gang's rank 1 compiles its first step 35 s late: gloo's collectives fail when
    ranks reach them more than 30 s apart, so the ranks must wait for each other before a step
    (``Gang.together``). The tests below check each outcome separately."""
    tmp = tmp_path_factory.mktemp("gang")
    warm = f'pretrain.cache_dir="{tmp / "warm"}"'
    one, gang = str(tmp / "one"), str(tmp / "gang")
    _finished(_run(one, [warm, 'workers.mode="threads"'], devices=2), one)

    proc = _run(gang, [warm, "workers.trainer_processes=2"], failpoints="trainer.step@3:sleep=30,gang.rank1.compile@1:sleep=35")
    deadline = time.monotonic() + 600
    while not os.path.exists(os.path.join(gang, "params", "manifests", "v2.json")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    rank1 = [s for s in _spawns(gang) if s.get("rank") == 1]
    assert len(rank1) == 1
    os.kill(rank1[0]["pid"], signal.SIGKILL)
    _finished(proc, gang)
    return {"one": one, "gang": gang}


def _digest(out: str) -> str:
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        return json.load(f)["final_digest"]


@pytest.mark.slow
def test_a_gang_that_lost_a_rank_is_restarted_whole_and_gives_the_bits_of_one_process(gang_runs):
    spawns = _spawns(gang_runs["gang"])
    assert sorted((s["worker_id"], s["rank"]) for s in spawns) == [
        ("trainer-0.1", 0), ("trainer-0.1", 1), ("trainer-0.2", 0), ("trainer-0.2", 1)]  # restarted whole
    assert _digest(gang_runs["one"]) == _digest(gang_runs["gang"])


@pytest.mark.slow
def test_a_gang_run_audits_clean(gang_runs):
    audit = subprocess.run([sys.executable, "-m", "runtime.cli", "audit", gang_runs["gang"], "check"], cwd=ROOT,
                           env=_env(), capture_output=True, text=True, timeout=300)
    assert audit.returncode == 0 and "I1–I8 hold" in audit.stdout, audit.stdout + audit.stderr


@pytest.mark.slow
def test_a_gang_run_replays_in_one_process_with_its_device_count_and_is_refused_with_fewer(gang_runs):
    gang = gang_runs["gang"]
    # the replay trains in one process with the gang's 2 devices: the same bits again
    replay = subprocess.run([sys.executable, "-m", "runtime.cli", "replay", gang, "--json"], cwd=ROOT, env=_env(2),
                            capture_output=True, text=True, timeout=600)
    assert replay.returncode == 0, replay.stderr[-2000:]
    report = json.loads(replay.stdout.strip().splitlines()[-1])
    assert report["match"] and report["final_digest"] == _digest(gang_runs["one"])
    assert "the run's trainer" not in replay.stderr  # 2 devices, as the gang had: no layout warning
    one_device = subprocess.run([sys.executable, "-m", "runtime.cli", "replay", gang], cwd=ROOT, env=_env(1),
                                capture_output=True, text=True, timeout=600)
    assert one_device.returncode != 0
    assert "the run's trainer ran on 2 devices in 2 process(es); this replay has 1" in one_device.stderr
    assert "needs 2 devices" in one_device.stderr and "Traceback" not in one_device.stderr


@pytest.mark.slow
def test_a_gang_run_records_its_layout_and_only_rank_0_joins(gang_runs):
    with open_store(gang_runs["gang"]) as store:
        events = [r.event for r in store.read("run")]
    assert events[0].config["workers"]["trainer_processes"] == 2
    assert events[0].fingerprint["trainer"] == {"processes": 2, "devices_per_process": 1, "mesh": "fsdp=2",
                                                "collectives": "gloo"}
    joins = [e for e in events if type(e).__name__ == "WorkerJoined" and e.role == "trainer"]
    assert [j.worker_id for j in joins] == ["trainer-0.1", "trainer-0.2"]  # only rank 0 joins
    fingerprint = joins[0].info["fingerprint"]
    assert (fingerprint["processes"], fingerprint["devices"], fingerprint["collectives"]) == (2, 2, "gloo")


REDUCTION_RANK = """
    import json, sys
    processes, rank, port, fixed = (int(a) for a in sys.argv[1:5])
    if processes > 1:
        from runtime.trainer.gang import Gang, GangSpec
        Gang.join(GangSpec(rank, processes, f"127.0.0.1:{port}"))
    import jax, numpy as np
    from kernels.algorithms import configure
    from runtime.config import MeshShape
    from runtime.model import ModelConfig, init_params
    from runtime.params.digest import params_digest
    from runtime.trainer import Sample, StepConfig, make_optimizer, pack, train_step
    from runtime.trainer.mesh import make_mesh, shard_rows, shard_tree
    from jax.experimental import multihost_utils

    model = ModelConfig(vocab_size=29, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
                        intermediate_size=48, initializer_range=0.3)
    rng = np.random.default_rng(0)
    samples = [Sample(np.int32([1, 5 + i // 4, 7]), np.int32(rng.integers(3, 29, 1 + i % 4)),
                      np.float32(-np.ones(1 + i % 4)), float(i % 3 == 0), 0) for i in range(16)]
    batch = pack(samples, group_size=4, width=8, pad_id=0)
    mesh = make_mesh(MeshShape(fsdp=jax.device_count()))
    config = StepConfig(model=model, objective=configure("reinforce"), learning_rate=1e-2, group_size=4,
                        fixed_order_mesh=mesh if fixed else None)
    params = shard_tree(mesh, init_params(model, key=jax.random.key(0)))
    opt = make_optimizer(config).init(params)
    b, z, c = shard_rows(mesh, (batch, np.zeros(batch.mask_BS.shape, np.float32), np.ones((16,), bool)))
    for _ in range(3):
        params, opt, metrics = train_step(params, opt, b, z, z, c, config=config)
        params, opt = shard_tree(mesh, params), shard_tree(mesh, opt)
    whole = jax.tree.map(np.asarray, multihost_utils.process_allgather(params, tiled=True))
    print(json.dumps({"digest": params_digest(whole), "loss": float(metrics["loss"]),
                      "sample": [float(x) for x in np.ravel(whole["layers_0"]["mlp"]["down_proj"]["kernel"])[:64]]}),
          flush=True)
    if processes > 1:
        jax.distributed.shutdown()
"""


def _layout(processes: int, devices: int, fixed: bool) -> dict:
    return _gang_of(REDUCTION_RANK, processes, devices, str(int(fixed)))[0]


@pytest.mark.slow
def test_the_deterministic_reduction_gives_the_same_bits_on_every_layout_of_four_devices():
    """``trainer.deterministic_reduction`` (``StepConfig.fixed_order_mesh``): three steps on
    ``fsdp=4`` as 1 process × 4 devices, 2 × 2 and 4 × 1 give the same parameters, bit for bit,
    and the same update as the compiler's reduction to float32 rounding."""
    fixed = [_layout(p, d, True) for p, d in ((1, 4), (2, 2), (4, 1))]
    assert fixed[0]["digest"] == fixed[1]["digest"] == fixed[2]["digest"]
    plain = _layout(1, 4, False)
    assert abs(plain["loss"] - fixed[0]["loss"]) < 1e-5
    assert max(abs(a - b) for a, b in zip(plain["sample"], fixed[0]["sample"], strict=True)) < 1e-5
    assert plain["sample"] != [0.0] * 64


def test_a_trainer_that_is_not_the_configured_gang_is_refused_in_one_line():
    import types

    from runtime.session import make_trainer

    gang_run = types.SimpleNamespace(config=load_config(None, ["workers.trainer_processes=2", "trainer.mesh={fsdp=2}"]))
    with pytest.raises(UsageError) as e:
        make_trainer(gang_run, None, "t")  # an rlx worker trainer started without --gang
    assert "--gang RANK/2 --coordinator HOST:PORT" in str(e.value) and "\n" not in str(e.value)
    one = types.SimpleNamespace(config=load_config(None, []), gang=None)
    with pytest.raises(UsageError, match="trains in one process"):
        make_trainer(one, None, "t", gang=types.SimpleNamespace(size=2))
