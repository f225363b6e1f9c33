"""Which devices each process of a run uses, and the environment that shows each only its own.

In processes mode ``rlx run`` starts the trainer (each rank of its gang), every inference worker
and every verifier as a process of its own, and evaluates held-out problems in its own (the host).
Left alone, JAX gives each process every local device and preallocates 75% of each GPU's memory
in each of them, so a second process on one GPU runs out of memory, and on a TPU VM the first
process owns the chips. ``workers.devices`` lays the host's devices out over the roles:

- ``"auto"`` (what a new run records when it is unset): in this order from device 0, the trainer
  takes ``trainer.mesh``'s devices (split evenly over the ranks of its gang), each inference
  worker ``inference.mesh``'s, and the evaluator (when ``eval.every_steps`` > 0) one engine's
  worth; devices left over stay idle (more inference workers would use them). Where the host has
  too few for disjoint sets, the roles share them, each starting again from device 0: on a GPU
  each process then gets a fixed share of the memory (``MEMORY_WEIGHTS``), on the CPU nothing is
  short (its devices are views of the same cores), and on a TPU, where a chip serves one process,
  the layout is refused.
- a table ``{trainer = [0, 1, 2, 3], inference = [[4, 5], [6, 7]], evaluator = [0]}`` names the
  sets; the roles it leaves out are placed by the rule above on the devices it leaves free.
- ``"inherit"``: every process sees what ``rlx run`` sees (a run logged before this setting
  existed reads as this; a threads-mode run is one process and always does).

Verifiers, and a host that evaluates nothing, need no device: they run on the CPU platform and
hold no device copy of the weights.

Each child's environment (:meth:`Layout.env`) sets the backend's visibility variables
(``CUDA_VISIBLE_DEVICES``; ``TPU_VISIBLE_CHIPS`` with the chip bounds; the host-device count on
the CPU), its memory fraction, and in deterministic mode on a GPU the XLA flags that make its
choices repeatable (``DETERMINISTIC_GPU_FLAGS``). ``RLX_DEVICES`` carries the host-level ids, which
the worker records in its ``WorkerJoined`` (:func:`joined_info`).

Nothing here decides anything the ledger's bits depend on: the layout is a function of the config
and the host's inventory, recorded in ``RunStarted`` and in every ``WorkerJoined``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from runtime.errors import UsageError

AUTO, INHERIT = "auto", "inherit"
CPU, GPU, TPU = "cpu", "gpu", "tpu"
TRAINER, INFERENCE, EVALUATOR = "trainer", "inference", "evaluator"
ROLES = (TRAINER, INFERENCE, EVALUATOR)
DEVICES_ENV = "RLX_DEVICES"  # the host-level ids of the devices a child sees, comma-separated
FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"
PREALLOCATE_ENV = "XLA_PYTHON_CLIENT_PREALLOCATE"
HOST_COUNT_FLAG = "--xla_force_host_platform_device_count"
# XLA:GPU picks kernels by timing them (autotuning) and may sum with atomics; both change bits from
# run to run. These flags make its choices fixed: deterministic ops (no atomics, no scatter by
# atomics) and no autotuning (the default kernel of each op).
DETERMINISTIC_GPU_FLAGS = ("--xla_gpu_deterministic_ops=true", "--xla_gpu_autotune_level=0")
MEMORY_WEIGHTS = {TRAINER: 3, INFERENCE: 2, EVALUATOR: 1}  # a shared GPU's memory, split by these
USABLE_MEMORY = 0.9  # of a GPU, over all the processes on it (the rest: CUDA contexts, fragments)
TPU_PORT = 8476  # each process on a TPU VM serves its chips' controller on its own port, from here
# Chips per process on a TPU VM: the sub-meshes libtpu accepts, as "x,y,z" bounds.
TPU_CHIP_BOUNDS = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,4,1"}
PROBE_TIMEOUT_S = 120.0
MAX_DEVICES = 4096

_PROBE = """
import json, jax
d = jax.local_devices()
stats = getattr(d[0], "memory_stats", lambda: None)() or {}
print(json.dumps({"backend": jax.default_backend(), "count": len(d), "kind": d[0].device_kind,
                  "memory_bytes": stats.get("bytes_limit")}))
"""


@dataclasses.dataclass(frozen=True)
class Inventory:
    """This host's local devices: backend (``cpu``, ``gpu``, ``tpu``), how many, their kind and
    memory (bytes per device; None where the backend does not say)."""

    backend: str
    count: int
    kind: str = "cpu"
    memory_bytes: int | None = None


def host_device_count(xla_flags: str) -> int:
    """The CPU devices ``XLA_FLAGS`` forces (1 without the flag)."""
    found = re.findall(rf"{HOST_COUNT_FLAG}=(\d+)", xla_flags)
    return int(found[-1]) if found else 1


def accelerator_present() -> bool:
    """Whether this machine has a GPU or TPU device file (no JAX backend is started to ask)."""
    return any(os.path.exists(p) for p in ("/dev/nvidia0", "/dev/accel0", "/dev/vfio/0")) or bool(
        os.path.isdir("/proc/driver/nvidia/gpus") and os.listdir("/proc/driver/nvidia/gpus"))


def inventory(environ: Mapping[str, str] | None = None) -> Inventory:
    """This host's devices, found without starting a JAX backend in this process (which would
    take a GPU's memory or a TPU's chips from the workers): on a host with no accelerator, or with
    ``JAX_PLATFORMS=cpu``, the CPU devices ``XLA_FLAGS`` forces; else a short-lived child process
    asks JAX (without preallocating).

    Raises:
        UsageError: the probe failed (its last line of output named).
    """
    environ = os.environ if environ is None else environ
    platforms = environ.get("JAX_PLATFORMS", "")
    if platforms.split(",")[0].strip() == CPU or not accelerator_present():
        return Inventory(CPU, host_device_count(environ.get("XLA_FLAGS", "")))
    env = {**environ, PREALLOCATE_ENV: "false"}
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise UsageError(f"asking JAX for this host's devices took over {PROBE_TIMEOUT_S:.0f} s; "
                         "is another process holding the accelerator?") from None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
        raise UsageError(f"asking JAX for this host's devices failed: {last}")
    found = json.loads(lines[-1])
    return Inventory(found["backend"], int(found["count"]), found["kind"], found.get("memory_bytes"))


@dataclasses.dataclass(frozen=True)
class Needs:
    """How many devices each role takes: the trainer's mesh and gang, each inference worker's
    engine mesh, the evaluator's (0: the host evaluates nothing)."""

    trainer: int
    trainer_processes: int
    inference: int
    inference_workers: int
    evaluator: int

    @classmethod
    def of(cls, config) -> Needs:
        """The needs of ``config`` (a ``runtime.config.Config``)."""
        from runtime.config import MeshShape

        engine = MeshShape.of(config.inference.mesh).model
        return cls(MeshShape.of(config.trainer.mesh).size, config.workers.trainer_processes, engine,
                   config.workers.inference, engine if config.eval.every_steps > 0 else 0)


Ids = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Layout:
    """The devices of each process of a run on one host.

    Attributes:
      inventory: the host's devices.
      trainer: each gang rank's ids (one tuple for a trainer of one process).
      inference: each inference worker's ids.
      evaluator: the host's ids (empty when it evaluates nothing).
      fractions: process name (``trainer``, ``inference-N``, ``evaluator``) → the share of a GPU's
        memory it may take; only on a GPU.
      shared: the processes that share a device with another.
      deterministic: the run is in deterministic mode (the GPU flags are set).
      inherit: every process sees what this one sees (no environment is set).
    """

    inventory: Inventory
    trainer: tuple[Ids, ...] = ()
    inference: tuple[Ids, ...] = ()
    evaluator: Ids = ()
    fractions: Mapping[str, float] = dataclasses.field(default_factory=dict)
    shared: frozenset[str] = frozenset()
    deterministic: bool = False
    inherit: bool = False

    def to_json(self) -> dict[str, Any]:
        """Role → ids, as ``RunStarted`` records it (``{"inherit": true}`` for an inherited one)."""
        if self.inherit:
            return {INHERIT: True, "backend": self.inventory.backend, "devices": self.inventory.count}
        return {TRAINER: [i for rank in self.trainer for i in rank], INFERENCE: [list(w) for w in self.inference],
                EVALUATOR: list(self.evaluator), "backend": self.inventory.backend,
                "devices": self.inventory.count, **({"memory_fractions": dict(self.fractions)} if self.fractions else {})}

    def idle(self) -> list[int]:
        """The host's devices no process uses."""
        used = {i for ids in (*self.trainer, *self.inference, self.evaluator) for i in ids}
        return [i for i in range(self.inventory.count) if i not in used]

    def describe(self) -> str:
        """One line for the run's log."""
        if self.inherit:
            return f"devices: every process sees this one's ({self.inventory.count} {self.inventory.backend})"

        parts = [f"trainer {' | '.join(_listed(r) for r in self.trainer)}",
                 *(f"inference-{n} {_listed(w)}" for n, w in enumerate(self.inference)),
                 f"evaluator {_listed(self.evaluator) or 'none'}"]
        idle = self.idle()
        inv = self.inventory
        kind = "" if inv.kind == inv.backend else f" {inv.kind}"
        return (f"devices ({inv.count} {inv.backend}{kind}): " + "; ".join(parts)
                + (f"; idle {_listed(idle)}" if idle else "") + (" (shared)" if self.shared else ""))

    # -- the environment of each process ----------------------------------------------------------

    def env(self, process: str, base: Mapping[str, str]) -> dict[str, str]:
        """The environment entries that show ``process`` (``trainer`` or ``trainer.R`` for rank R,
        ``inference-N``, ``evaluator``, ``verifier``) only its devices, over ``base`` (the
        environment it would inherit): the entries to set. An inherited layout sets nothing but,
        on a GPU in deterministic mode, the flags that make XLA's choices repeatable."""
        backend = self.inventory.backend
        if self.inherit:
            deterministic = backend == GPU and self.deterministic
            return {"XLA_FLAGS": with_flags(base.get("XLA_FLAGS", ""), DETERMINISTIC_GPU_FLAGS)} if deterministic else {}
        if process == "verifier" or (process == EVALUATOR and not self.evaluator):
            return _cpu_env((), base)
        ids, name = self._process_ids(process)
        if backend == CPU:
            return _cpu_env(ids, base)
        if backend == GPU:
            env = {"JAX_PLATFORMS": "cuda", "CUDA_VISIBLE_DEVICES": _listed(ids), DEVICES_ENV: _listed(ids),
                   FRACTION_ENV: f"{self.fractions.get(name, USABLE_MEMORY):.3f}"}
            env[PREALLOCATE_ENV] = "false" if name in self.shared else "true"
            if self.deterministic:
                env["XLA_FLAGS"] = with_flags(base.get("XLA_FLAGS", ""), DETERMINISTIC_GPU_FLAGS)
            return env
        port = TPU_PORT + self._index(process)
        return {"JAX_PLATFORMS": "tpu", "TPU_VISIBLE_CHIPS": _listed(ids), DEVICES_ENV: _listed(ids),
                "TPU_CHIPS_PER_PROCESS_BOUNDS": TPU_CHIP_BOUNDS[len(ids)], "TPU_PROCESS_BOUNDS": "1,1,1",
                "TPU_MESH_CONTROLLER_ADDRESS": f"localhost:{port}", "TPU_MESH_CONTROLLER_PORT": str(port)}

    def _process_ids(self, process: str) -> tuple[Ids, str]:
        """``process``'s ids and its name in ``fractions``."""
        role, _, index = process.partition(".") if process.startswith(TRAINER) else process.partition("-")
        if role == TRAINER:
            return self.trainer[int(index or 0)], TRAINER
        if role == INFERENCE:
            return self.inference[int(index)], process
        if role == EVALUATOR:
            return self.evaluator, EVALUATOR
        raise ValueError(f"no process {process!r} in a layout")

    def _index(self, process: str) -> int:
        """``process``'s place among the layout's processes (its TPU controller port)."""
        names = [*(f"{TRAINER}.{r}" for r in range(len(self.trainer))),
                 *(f"{INFERENCE}-{n}" for n in range(len(self.inference))), EVALUATOR]
        return names.index(f"{TRAINER}.0" if process == TRAINER else process)


def _listed(ids: Sequence[int]) -> str:
    """``ids`` as a variable's value: ``0,1,2``."""
    return ",".join(map(str, ids))


def with_flags(xla_flags: str, flags: Sequence[str]) -> str:
    """``xla_flags`` with each of ``flags`` (``--name=value``) set, replacing that flag's value."""
    kept = xla_flags.split()
    for flag in flags:
        name = flag.split("=", 1)[0]
        kept = [f for f in kept if f.split("=", 1)[0] != name]
    return " ".join([*kept, *flags])


def _cpu_env(ids: Sequence[int], base: Mapping[str, str]) -> dict[str, str]:
    """A process on the CPU platform with ``len(ids)`` host devices, or one that uses no device
    (``ids`` empty: it gets one). The host-device count is set only where it differs from
    ``base``'s, so a process of one device keeps the ``XLA_FLAGS`` it would inherit."""
    env = {"JAX_PLATFORMS": CPU, DEVICES_ENV: _listed(ids)}
    count = max(1, len(ids))
    if count != host_device_count(base.get("XLA_FLAGS", "")):
        env["XLA_FLAGS"] = with_flags(base.get("XLA_FLAGS", ""), (f"{HOST_COUNT_FLAG}={count}",))
    return env


# -- planning -------------------------------------------------------------------------------------


def _fail(spec: Any, why: str) -> UsageError:
    return UsageError(f"workers.devices {spec!r}: {why}")


def _parse_ids(spec: Any, role: str, value: Any, count: int) -> Ids:
    if not (isinstance(value, (list, tuple)) and value and all(type(i) is int for i in value)):
        raise _fail(spec, f"{role} must be a non-empty list of device ids (e.g. [0, 1])")
    if len(set(value)) != len(value):
        raise _fail(spec, f"{role} names a device twice ({list(value)})")
    bad = [i for i in value if not 0 <= i < count]
    if bad:
        raise _fail(spec, f"{role} names device {bad[0]} but this host has {count} (ids 0 to {count - 1})")
    return tuple(value)


def plan(spec: Any, needs: Needs, inv: Inventory, *, deterministic: bool = False) -> Layout:
    """The layout of ``spec`` (``workers.devices``: None reads as ``"inherit"``, a run logged
    before it existed) for ``needs`` on ``inv``.

    Raises:
        UsageError: in one line, a layout that cannot be: more devices named than the host has, a
        role given a set of the wrong size, two processes on one TPU chip, a gang whose devices
        do not split evenly over its ranks.
    """
    if spec is None or spec == INHERIT:
        return Layout(inv, inherit=True, deterministic=deterministic)
    if isinstance(spec, str) and spec != AUTO:
        raise _fail(spec, f'accepted: "{AUTO}", "{INHERIT}", or a table of role = device ids '
                          '(e.g. {trainer = [0, 1], inference = [[2], [3]], evaluator = [2]})')
    table = {} if spec == AUTO else dict(spec)
    unknown = sorted(set(table) - set(ROLES))
    if unknown:
        raise _fail(spec, f"unknown role {unknown[0]!r}; accepted: {', '.join(ROLES)}")
    if not 1 <= inv.count <= MAX_DEVICES:
        raise _fail(spec, f"this host reports {inv.count} devices")
    sizes = {TRAINER: needs.trainer, EVALUATOR: needs.evaluator}
    named: dict[str, Any] = {}
    if TRAINER in table:
        named[TRAINER] = _parse_ids(spec, TRAINER, table[TRAINER], inv.count)
    if EVALUATOR in table:
        named[EVALUATOR] = _parse_ids(spec, EVALUATOR, table[EVALUATOR], inv.count)
    if INFERENCE in table:
        workers = table[INFERENCE]
        if not isinstance(workers, (list, tuple)) or len(workers) != needs.inference_workers:
            raise _fail(spec, f"inference must list one set of ids per inference worker "
                              f"(workers.inference = {needs.inference_workers}), e.g. [[2], [3]]")
        named[INFERENCE] = tuple(_parse_ids(spec, f"inference[{n}]", w, inv.count) for n, w in enumerate(workers))
    for role, ids in named.items():
        for n, one in enumerate(ids if role == INFERENCE else (ids,)):
            want = needs.inference if role == INFERENCE else sizes[role]
            what = {TRAINER: "trainer.mesh", INFERENCE: "inference.mesh", EVALUATOR: "inference.mesh"}[role]
            if role == EVALUATOR and want == 0:
                raise _fail(spec, "names evaluator devices but the run evaluates nothing (eval.every_steps = 0)")
            if len(one) != want:
                who = f"inference[{n}]" if role == INFERENCE else role
                raise _fail(spec, f"{who} has {len(one)} devices but {what} takes {want}")
    # The roles the table leaves out, in order from the first free device; sharing where too few.
    used = {i for role, ids in named.items() for one in (ids if role == INFERENCE else (ids,)) for i in one}
    free = [i for i in range(inv.count) if i not in used]
    wanted = [(TRAINER, needs.trainer)] if TRAINER not in named else []
    if INFERENCE not in named:
        wanted += [(f"{INFERENCE}-{n}", needs.inference) for n in range(needs.inference_workers)]
    if EVALUATOR not in named and needs.evaluator:
        wanted.append((EVALUATOR, needs.evaluator))
    placed: dict[str, Ids] = {}
    if sum(n for _, n in wanted) <= len(free):
        at = 0
        for name, n in wanted:
            placed[name] = tuple(free[at:at + n])
            at += n
    else:
        for name, n in wanted:
            # On the CPU a gang's ranks may together take more devices than the host has (each rank
            # its own views of the cores); no process may take more than the host has.
            per_process = n // needs.trainer_processes if name == TRAINER else n
            if per_process > inv.count or (n > inv.count and inv.backend != CPU):
                mesh = "trainer.mesh" if name == TRAINER else "inference.mesh"
                hint = (f"; on CPU, XLA_FLAGS={HOST_COUNT_FLAG}={per_process} gives it as many"
                        if inv.backend == CPU else "")
                raise _fail(spec, f"{name} takes {n} devices ({mesh}) but this host has {inv.count} "
                                  f"{inv.backend}{hint}")
            placed[name] = tuple(range(n))  # on the CPU, ids past the host's count are more views of its cores
    trainer = named.get(TRAINER, placed.get(TRAINER, ()))
    inference = named.get(INFERENCE) or tuple(placed[f"{INFERENCE}-{n}"] for n in range(needs.inference_workers))
    evaluator = named.get(EVALUATOR, placed.get(EVALUATOR, ()))
    if len(trainer) % needs.trainer_processes:
        raise _fail(spec, f"the trainer's {len(trainer)} devices do not split over its gang of "
                          f"{needs.trainer_processes} processes")
    per_rank = len(trainer) // needs.trainer_processes
    ranks = tuple(trainer[r * per_rank:(r + 1) * per_rank] for r in range(needs.trainer_processes))
    processes = {**{f"{TRAINER}.{r}": ids for r, ids in enumerate(ranks)},
                 **{f"{INFERENCE}-{n}": ids for n, ids in enumerate(inference)},
                 **({EVALUATOR: evaluator} if evaluator else {})}
    holders: dict[int, list[str]] = {}
    for name, ids in processes.items():
        for i in ids:
            holders.setdefault(i, []).append(name)
    shared = {name for names in holders.values() if len(names) > 1 for name in names}
    if inv.backend == TPU:
        for i, names in sorted(holders.items()):
            if len(names) > 1:
                raise _fail(spec, f"TPU chip {i} would serve {' and '.join(names)}, but a chip serves one process; "
                                  "give each its own chips, or set eval.every_steps=0 or workers.mode=\"threads\"")
        for name, ids in processes.items():
            if len(ids) not in TPU_CHIP_BOUNDS:
                raise _fail(spec, f"{name} has {len(ids)} TPU chips; a process takes "
                                  f"{', '.join(map(str, TPU_CHIP_BOUNDS))} chips")
    fractions: dict[str, float] = {}
    if inv.backend == GPU:
        def weight(name: str) -> int:
            return MEMORY_WEIGHTS[name.split(".")[0].split("-")[0]]

        for name, ids in processes.items():
            share = min(weight(name) / sum(weight(other) for other in holders[i]) for i in ids)
            key = TRAINER if name.startswith(TRAINER) else name
            fractions[key] = round(USABLE_MEMORY * share, 3)
    shared_names = frozenset(TRAINER if s.startswith(TRAINER) else s for s in shared)
    return Layout(inv, ranks, tuple(inference), evaluator, fractions, shared_names, deterministic)


def for_run(config, *, new: bool, inv: Inventory | None = None) -> Layout:
    """The layout of ``config``'s processes on this host (``inv``: its inventory, asked for when
    None). ``new``: a run about to be created, whose unset ``workers.devices`` is ``"auto"`` (a
    logged run's reads as ``"inherit"``); a threads-mode run is one process, which sees every device."""
    from runtime.config import DETERMINISTIC, PROCESSES

    devices = config.workers.devices
    spec = devices if config.workers.mode == PROCESSES else INHERIT
    if spec is None and new:
        spec = AUTO
    inv = inventory() if inv is None else inv
    deterministic = config.scheduling.mode == DETERMINISTIC
    if inv.backend == GPU and deterministic:
        check_deterministic_flags(os.environ.get("XLA_FLAGS", ""))
    return plan(spec, Needs.of(config), inv, deterministic=deterministic)


def check_deterministic_flags(xla_flags: str) -> None:
    """A deterministic run on a GPU must not switch off what makes XLA's choices repeatable.

    Raises:
        UsageError: ``XLA_FLAGS`` sets one of ``DETERMINISTIC_GPU_FLAGS`` to another value.
    """
    for flag in DETERMINISTIC_GPU_FLAGS:
        name, want = flag.split("=", 1)
        found = re.findall(rf"{re.escape(name)}=(\S+)", xla_flags)
        if found and found[-1] != want:
            raise UsageError(f"XLA_FLAGS sets {name}={found[-1]}, but a deterministic run on a GPU needs {flag} "
                             "(XLA's choices would differ from run to run); remove it, or set "
                             'scheduling.mode="freshest"')


def apply_to_this_process(layout: Layout, process: str = EVALUATOR) -> bool:
    """Show this process (the host) only its devices, if its JAX backend has not started yet;
    returns whether it could (a backend that has started keeps what it sees).

    Raises:
        UsageError: a deterministic run on a GPU in a process whose backend started without the
        flags that make XLA's choices repeatable.
    """
    from jax._src import xla_bridge

    env = layout.env(process, os.environ)
    if not env:
        return False
    if xla_bridge.backends_are_initialized():
        if layout.deterministic and layout.inventory.backend == GPU:
            check_process(True)
        return False
    os.environ.update(env)
    return True


def check_process(deterministic: bool) -> None:
    """A process about to train or sample in a deterministic run: on a GPU, its XLA must have been
    started with ``DETERMINISTIC_GPU_FLAGS`` (a worker started by hand, or a backend started
    before the run set them, may lack them).

    Raises:
        UsageError: naming the missing flags and how to set them.
    """
    import jax

    if not deterministic or jax.default_backend() != GPU:
        return
    flags = os.environ.get("XLA_FLAGS", "").split()
    missing = [f for f in DETERMINISTIC_GPU_FLAGS if f not in flags]
    if missing:
        raise UsageError(f"a deterministic run on a GPU needs XLA_FLAGS to hold {' '.join(missing)} (XLA's choices "
                         "would differ from run to run); set them before the process starts, or set "
                         'scheduling.mode="freshest"')


def joined_info(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What a worker's ``WorkerJoined`` records of its devices: the host-level ids its layout gave
    it (None when it inherited them), the kind and local count JAX reports, and its memory limit
    (bytes on a GPU or TPU; the fraction of a GPU it was given)."""
    import jax

    environ = os.environ if environ is None else environ
    local = jax.local_devices()
    ids = environ.get(DEVICES_ENV)
    stats = getattr(local[0], "memory_stats", lambda: None)() or {}
    fraction = environ.get(FRACTION_ENV)
    return {"devices": None if ids is None else [int(i) for i in ids.split(",") if i],
            "backend": jax.default_backend(), "kind": local[0].device_kind, "local": len(local),
            "memory_limit_bytes": stats.get("bytes_limit"),
            "memory_fraction": None if fraction is None else float(fraction)}


__all__ = ["AUTO", "DETERMINISTIC_GPU_FLAGS", "INHERIT", "Inventory", "Layout", "Needs", "accelerator_present", "apply_to_this_process",
           "check_deterministic_flags", "check_process", "for_run", "inventory", "joined_info", "plan", "with_flags"]
