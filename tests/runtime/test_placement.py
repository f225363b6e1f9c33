"""A run's device layout (``runtime.placement``): which devices each process sees, per backend.

The layouts and the environment each child gets are built for CPU, GPU and TPU hosts without the
hardware (an ``Inventory`` stands for the host); a run with 8 forced CPU host devices lays its
trainer and two inference workers out over disjoint sets, records them, survives the kill of an
inference worker on the same devices, replays bit-exactly and audits clean; an impossible layout
is refused in one line before anything is created.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ledger import open_store
from runtime.config import Config, ConfigError, load_config
from runtime.errors import UsageError
from runtime.placement import (
    DETERMINISTIC_GPU_FLAGS,
    Inventory,
    Needs,
    check_deterministic_flags,
    for_run,
    inventory,
    plan,
    with_flags,
)
from tests.runtime.small_run import TINY

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CPU8 = Inventory("cpu", 8)
GPU1 = Inventory("gpu", 1, "NVIDIA H200", 140 << 30)
GPU8 = Inventory("gpu", 8, "NVIDIA H200", 140 << 30)
TPU4 = Inventory("tpu", 4, "TPU v4")
TPU8 = Inventory("tpu", 8, "TPU v5 lite")


def _needs(trainer=1, ranks=1, engine=1, workers=1, evaluator=1) -> Needs:
    return Needs(trainer, ranks, engine, workers, evaluator)


def _sets(layout) -> list[set[int]]:
    return [set(ids) for ids in (*layout.trainer, *layout.inference, layout.evaluator) if ids]


def test_auto_gives_each_process_its_own_devices_in_order_and_leaves_the_rest_idle():
    layout = plan("auto", _needs(trainer=4, engine=2, workers=2, evaluator=0), CPU8)
    assert layout.trainer == ((0, 1, 2, 3),) and layout.inference == ((4, 5), (6, 7)) and layout.evaluator == ()
    assert not layout.shared and layout.idle() == []
    gang = plan("auto", _needs(trainer=4, ranks=2, workers=1, evaluator=1), GPU8)
    assert gang.trainer == ((0, 1), (2, 3)) and gang.inference == ((4,),) and gang.evaluator == (5,)
    assert gang.idle() == [6, 7] and "idle 6,7" in gang.describe()
    assert gang.fractions == {"trainer": 0.9, "inference-0": 0.9, "evaluator": 0.9}  # alone on each device
    sets = _sets(gang)
    assert all(a.isdisjoint(b) for i, a in enumerate(sets) for b in sets[i + 1:])
    assert gang.to_json() == {"trainer": [0, 1, 2, 3], "inference": [[4]], "evaluator": [5], "backend": "gpu",
                              "devices": 8, "memory_fractions": gang.fractions}


def test_too_few_devices_share_on_a_gpu_by_memory_share_and_on_the_cpu_as_views_but_never_on_a_tpu():
    one = plan("auto", _needs(), GPU1)
    assert one.trainer == ((0,),) and one.inference == ((0,),) and one.evaluator == (0,)
    assert one.shared == {"trainer", "inference-0", "evaluator"}
    assert sum(one.fractions.values()) <= 0.9 + 1e-9 and one.fractions["trainer"] > one.fractions["inference-0"] \
        > one.fractions["evaluator"]
    cpu = plan("auto", _needs(trainer=2, ranks=2), Inventory("cpu", 1))  # a gang of 2 × 1 on a 1-device host
    assert cpu.trainer == ((0,), (1,)) and cpu.fractions == {}
    with pytest.raises(UsageError) as e:
        plan("auto", _needs(trainer=4, workers=1), TPU4)  # 4 + 1 + 1 chips on a 4-chip host
    assert "a chip serves one process" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UsageError, match=r"takes 2 devices \(trainer.mesh\) but this host has 1 gpu"):
        plan("auto", _needs(trainer=2), GPU1)
    with pytest.raises(UsageError, match="count=4 gives it as many"):  # one process past the host's CPU devices
        plan("auto", _needs(trainer=4), Inventory("cpu", 1))


@pytest.mark.parametrize(("spec", "needs", "inv", "words"), [
    ({"trainer": [9]}, _needs(evaluator=0), CPU8, "names device 9 but this host has 8 (ids 0 to 7)"),
    ({"trainer": [0, 1]}, _needs(evaluator=0), CPU8, "trainer has 2 devices but trainer.mesh takes 1"),
    ({"trainer": [0, 0]}, _needs(trainer=2, evaluator=0), CPU8, "names a device twice"),
    ({"trainer": []}, _needs(evaluator=0), CPU8, "non-empty list of device ids"),
    ({"inference": [[1]]}, _needs(workers=2, evaluator=0), CPU8, "one set of ids per inference worker"),
    ({"evaluator": [3]}, _needs(evaluator=0), CPU8, "the run evaluates nothing"),
    ({"trainer": [0, 1, 2]}, _needs(trainer=3, ranks=2, evaluator=0), CPU8, "do not split over its gang of 2"),
    ({"trainer": [0, 1]}, _needs(trainer=2, engine=1, evaluator=0) , TPU4, None),
    ({"trainer": [0, 1, 2]}, _needs(trainer=3, evaluator=0), TPU8, "a process takes 1, 2, 4, 8 chips"),
    ({"trainer": [0], "inference": [[0]]}, _needs(evaluator=0), TPU4, "TPU chip 0 would serve trainer.0 and inference-0"),
    ({"gpu": [0]}, _needs(), CPU8, "unknown role 'gpu'"),
    ("everywhere", _needs(), CPU8, 'accepted: "auto", "inherit"'),
])
def test_an_impossible_layout_is_refused_in_one_line(spec, needs, inv, words):
    if words is None:  # the control: a layout that fits
        assert plan(spec, needs, inv).trainer == ((0, 1),)
        return
    with pytest.raises(UsageError) as e:
        plan(spec, needs, inv)
    message = str(e.value)
    assert message.startswith("workers.devices ") and words in message and "\n" not in message, message


def test_a_table_places_the_roles_it_names_and_auto_the_rest_on_the_free_devices():
    layout = plan({"trainer": [4, 5], "evaluator": [7]}, _needs(trainer=2, workers=2), CPU8)
    assert layout.trainer == ((4, 5),) and layout.evaluator == (7,) and layout.inference == ((0,), (1,))


def test_each_process_gets_the_environment_of_its_backend():
    cpu = plan("auto", _needs(trainer=4, engine=2, workers=2, evaluator=0), CPU8)
    assert cpu.env("trainer.0", {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --foo=1"}) == {
        "JAX_PLATFORMS": "cpu", "RLX_DEVICES": "0,1,2,3",
        "XLA_FLAGS": "--foo=1 --xla_force_host_platform_device_count=4"}
    assert cpu.env("inference-1", {})["RLX_DEVICES"] == "6,7"
    one = plan("auto", _needs(), Inventory("cpu", 1))
    assert one.env("inference-0", {"XLA_FLAGS": "--bar"}) == {"JAX_PLATFORMS": "cpu", "RLX_DEVICES": "0"}  # as inherited
    assert cpu.env("verifier", {}) == {"JAX_PLATFORMS": "cpu", "RLX_DEVICES": ""}  # no device
    assert cpu.env("evaluator", {}) == {"JAX_PLATFORMS": "cpu", "RLX_DEVICES": ""}  # evaluates nothing

    gpu = plan("auto", _needs(trainer=2, ranks=2), GPU8, deterministic=True)
    rank1 = gpu.env("trainer.1", {"XLA_FLAGS": "--xla_gpu_autotune_level=4"})
    assert rank1["JAX_PLATFORMS"] == "cuda" and rank1["CUDA_VISIBLE_DEVICES"] == "1" and rank1["RLX_DEVICES"] == "1"
    assert rank1["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.900" and rank1["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"
    assert rank1["XLA_FLAGS"].split() == list(DETERMINISTIC_GPU_FLAGS)  # the user's autotune level replaced
    assert gpu.env("inference-0", {})["CUDA_VISIBLE_DEVICES"] == "2" and gpu.env("evaluator", {})["RLX_DEVICES"] == "3"
    assert gpu.env("verifier", {})["JAX_PLATFORMS"] == "cpu"
    shared = plan("auto", _needs(), GPU1, deterministic=False)
    env = shared.env("inference-0", {})
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false" and env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.300"
    assert "XLA_FLAGS" not in env  # async mode: XLA chooses freely

    tpu = plan("auto", _needs(trainer=2, workers=1, evaluator=0), TPU4)
    trainer, worker = tpu.env("trainer", {}), tpu.env("inference-0", {})
    assert trainer["TPU_VISIBLE_CHIPS"] == "0,1" and trainer["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "1,2,1"
    assert worker["TPU_VISIBLE_CHIPS"] == "2" and worker["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "1,1,1"
    assert {trainer["TPU_PROCESS_BOUNDS"], worker["TPU_PROCESS_BOUNDS"]} == {"1,1,1"}
    assert trainer["TPU_MESH_CONTROLLER_PORT"] != worker["TPU_MESH_CONTROLLER_PORT"]  # one controller each
    assert tpu.env("evaluator", {})["JAX_PLATFORMS"] == "cpu"  # no chip left for it: it evaluates nothing


def test_a_deterministic_gpu_run_refuses_flags_that_undo_determinism(monkeypatch):
    check_deterministic_flags("--xla_gpu_deterministic_ops=true --foo")
    with pytest.raises(UsageError) as e:
        check_deterministic_flags("--xla_gpu_autotune_level=4")
    assert "--xla_gpu_autotune_level=0" in str(e.value) and "\n" not in str(e.value)
    config = load_config(None, [])
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_deterministic_ops=false")
    with pytest.raises(UsageError, match="xla_gpu_deterministic_ops=false"):
        for_run(config, new=True, inv=GPU1)
    asynchronous = load_config(None, ['scheduling.mode="freshest"'])
    assert not for_run(asynchronous, new=True, inv=GPU1).deterministic
    assert with_flags("--a=1 --b=2", ["--a=3"]) == "--b=2 --a=3"


def test_the_setting_reads_auto_for_new_runs_inherit_for_logged_ones_and_threads_inherit():
    config = Config.from_dict({})
    assert config.workers.devices is None and load_config(None, []).workers.devices == "auto"
    assert not for_run(config, new=True, inv=CPU8).inherit
    assert for_run(config, new=False, inv=CPU8).inherit  # a run logged before the setting existed
    assert for_run(load_config(None, ['workers.mode="threads"']), new=True, inv=CPU8).inherit
    table = load_config(None, ["workers.devices={trainer=[0,1],inference=[[2],[3]]}"])
    assert table.workers.devices == {"trainer": [0, 1], "inference": [[2], [3]]}
    for value, words in (("3", "a string or a table"), ('"everywhere"', "accepted: 'auto', 'inherit'"),
                         ("{gpu=[0]}", "unknown role 'gpu'")):
        with pytest.raises(ConfigError) as e:
            load_config(None, [f"workers.devices={value}"])
        assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_host_without_an_accelerator_counts_the_cpu_devices_xla_forces():
    assert inventory({"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}) == CPU8
    assert inventory({"JAX_PLATFORMS": "cpu"}) == Inventory("cpu", 1)


# -- a run on 8 CPU host devices -------------------------------------------------------------------


def _env(devices: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "RLX_FAILPOINTS", "JAX_PLATFORMS")}
    return {**env, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
            "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _rlx(*argv: str, devices: int = 8, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runtime.cli", *argv], cwd=ROOT, env=_env(devices),
                          capture_output=True, text=True, timeout=timeout)


LAYOUT_RUN = [*TINY, "model.num_kv_heads=2", "eval.every_steps=0", "trainer.mesh={fsdp=4}", "inference.mesh={model=2}",
              "workers.inference=2"]


@pytest.fixture(scope="module")
def laid_out(tmp_path_factory) -> dict:
    """An 8-step run on 8 host devices, trainer on 4 and two inference workers on 2 each (auto),
    whose inference-1 is SIGKILLed once version 1 is published."""
    tmp = tmp_path_factory.mktemp("placement")
    out = str(tmp / "run")
    argv = [sys.executable, "-m", "runtime.cli", "run", "--out", out, "--steps", "8", "--no-progress"]
    for o in [*LAYOUT_RUN, f'pretrain.cache_dir="{tmp / "warm"}"']:
        argv += ["--set", o]
    proc = subprocess.Popen(argv, cwd=ROOT, env=_env(8), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while not os.path.exists(os.path.join(out, "params", "manifests", "v1.json")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    with open(os.path.join(out, "workers.jsonl"), encoding="utf-8") as f:
        spawns = [e for e in map(json.loads, f) if e["event"] == "spawn" and e["slot"] == "inference-1"]
    os.kill(spawns[-1]["pid"], signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    with open(os.path.join(out, "workers.jsonl"), encoding="utf-8") as f:
        spawns = [e for e in map(json.loads, f) if e["event"] == "spawn"]
    return {"out": out, "stdout": stdout, "spawns": spawns}


@pytest.mark.slow
def test_a_laid_out_run_records_disjoint_devices_and_restarts_a_killed_worker_on_its_own(laid_out):
    assert "devices (8 cpu): trainer 0,1,2,3; inference-0 4,5; inference-1 6,7; evaluator none" in " ".join(
        laid_out["stdout"].split())
    with open_store(laid_out["out"]) as store:
        events = [r.event for r in store.read("run")]
    assert events[0].config["workers"]["devices"] == "auto"
    assert json.loads(json.dumps(events[0].fingerprint["layout"])) == {"trainer": [0, 1, 2, 3], "inference": [[4, 5], [6, 7]],
                                               "evaluator": [], "backend": "cpu", "devices": 8}
    joined = {e.worker_id: json.loads(json.dumps(e.info["placement"])) for e in events
              if type(e).__name__ == "WorkerJoined"}
    by_slot = {wid.split(".")[0]: p["devices"] for wid, p in joined.items()}
    assert by_slot == {"trainer-0": [0, 1, 2, 3], "inference-0": [4, 5], "inference-1": [6, 7], "verifier-0": []}
    assert all(p["local"] == len(p["devices"]) and p["backend"] == "cpu" for wid, p in joined.items()
               if not wid.startswith("verifier"))
    # the killed worker's slot was started again on its devices (and joined with them if it got there in time)
    again = [e for e in laid_out["spawns"] if e["slot"] == "inference-1"]
    assert len(again) == 2 and {e["devices"] for e in again} == {"6,7"}
    assert {tuple(p["devices"]) for wid, p in joined.items() if wid.startswith("inference-1.")} == {(6, 7)}
    assert {e["slot"]: e["devices"] for e in laid_out["spawns"]} == {
        "trainer-0": "0,1,2,3", "inference-0": "4,5", "inference-1": "6,7", "verifier-0": ""}


@pytest.mark.slow
def test_a_laid_out_run_replays_bit_exactly_and_audits_clean(laid_out):
    replay = _rlx("replay", laid_out["out"], "--json", devices=4)  # the trainer's 4 devices
    assert replay.returncode == 0, replay.stderr[-2000:]
    report = json.loads(replay.stdout.strip().splitlines()[-1])
    with open(os.path.join(laid_out["out"], "summary.json"), encoding="utf-8") as f:
        final = json.load(f)["final_digest"]
    assert report["match"] and report["final_digest"] == final and not report["fingerprint_differs"]
    audit = _rlx("audit", laid_out["out"], "check")
    assert audit.returncode == 0 and "I1–I8 hold" in audit.stdout, audit.stdout + audit.stderr
    layout = _rlx("audit", laid_out["out"], "layout", "--json")
    doc = json.loads(layout.stdout)
    assert doc["layout"]["inference"] == [[4, 5], [6, 7]]
    assert [w["devices"] for w in doc["workers"] if w["role"] == "trainer"] == [[0, 1, 2, 3]]
    text = _rlx("audit", laid_out["out"], "layout")
    assert "inference-1" in text.stdout and "6,7" in text.stdout


@pytest.mark.slow
def test_an_impossible_layout_is_refused_before_anything_is_created(tmp_path):
    out = tmp_path / "never"
    proc = _rlx("run", "--out", str(out), "--steps", "2", "--no-progress",
                *[a for o in [*LAYOUT_RUN, "workers.devices={trainer=[0,1,2,9]}"] for a in ("--set", o)])
    assert proc.returncode != 0 and not out.exists()
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1] == ("rlx: error: workers.devices {'trainer': [0, 1, 2, 9]}: trainer names device 9 but this "
                         "host has 8 (ids 0 to 7)"), proc.stderr


def test_an_inherited_layout_sets_only_the_deterministic_flags_on_a_gpu():
    assert plan("inherit", _needs(), GPU1, deterministic=True).env("trainer", {"XLA_FLAGS": "--x=1"}) == {
        "XLA_FLAGS": "--x=1 " + " ".join(DETERMINISTIC_GPU_FLAGS)}
    assert plan("inherit", _needs(), GPU1, deterministic=False).env("trainer", {}) == {}
    assert plan(None, _needs(), CPU8, deterministic=True).env("trainer", {}) == {}


def test_a_trainer_process_builds_no_engine_and_records_its_devices(tmp_path, monkeypatch):
    from runtime.host.roles import role_from_config
    from runtime.params import ParamStore
    from runtime.session import EngineShape

    def no_engine(self, model):
        raise AssertionError("a trainer process built an inference engine")

    monkeypatch.setattr(EngineShape, "build", no_engine)
    monkeypatch.setenv("RLX_DEVICES", "0")
    url = f"file://{tmp_path / 'params'}"
    ParamStore.open(url, create=True)
    config = load_config(None, [*TINY, "pretrain.steps=0"])
    role = role_from_config("trainer", config, url, log=lambda line: None)
    assert role.info["placement"]["devices"] == [0] and role.info["placement"]["backend"] == "cpu"
    with pytest.raises(AssertionError, match="built an inference engine"):  # the control: an inference worker does
        role_from_config("inference", config, url, log=lambda line: None)


def test_a_gang_rank_chooses_its_collectives_before_its_backend_starts():
    from runtime.trainer.gang import gang_platform

    assert gang_platform({"JAX_PLATFORMS": "cpu"}) == "cpu"
    assert gang_platform({"JAX_PLATFORMS": "cuda"}) == "cuda"  # NCCL, not gloo
    assert gang_platform({"JAX_PLATFORMS": "tpu,cpu"}) == "tpu"
