"""The trainer's device mesh: axes, the sharding of each parameter, the batch's sharding.

``trainer.mesh = {data=…, fsdp=…, model=…}`` (axes left out are 1) lays the train step out on a
``jax.sharding.Mesh`` of that shape over the first ``data · fsdp · model`` devices, and the step
runs as one SPMD program (GSPMD inserts the collectives):

- ``data`` and ``fsdp`` split the batch's rows (data parallelism);
- ``fsdp`` also splits every weight along its input dimension (fully sharded data parallelism:
  each device holds a slice of the parameters and of Adam's moments);
- ``model`` splits the attention heads and the MLP's intermediate units (tensor parallelism:
  the output dimension of ``q/k/v/gate/up`` projections and the LM head, the input dimension of
  ``o`` and ``down`` projections).

A dimension that an axis does not divide stays whole (replicated over that axis), and vectors
(norm scales, biases of row-parallel projections) are replicated, so every model fits every
mesh. The rules read the Hugging Face names the model's parameters carry
(``runtime.model.layers``); the optimizer state's moments have the parameters' paths and get
their shardings. The same mesh and the same inputs always give the same bits; another mesh gives
other last bits (the reductions split differently), which is why the mesh is part of the config.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from runtime.config import MESH_AXES as AXES
from runtime.config import MeshShape

ROWS = ("data", "fsdp")  # the axes that split a batch's rows
# Projections whose output dimension the model axis splits (column-parallel) and whose input
# dimension it splits (row-parallel, followed by a sum over that axis).
COLUMN_PARALLEL = frozenset({"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "lm_head"})
ROW_PARALLEL = frozenset({"o_proj", "down_proj"})


def make_mesh(shape: MeshShape, devices: list | None = None) -> Mesh | None:
    """The ``Mesh`` of ``shape`` over the first ``shape.size`` devices (None for one device).

    Raises ValueError when there are fewer devices than the mesh needs.
    """
    if shape.size == 1:
        return None
    devices = list(jax.devices() if devices is None else devices)
    if len(devices) < shape.size:
        raise ValueError(
            f"trainer.mesh {shape.describe()} needs {shape.size} devices and this process has {len(devices)} "
            f"({jax.default_backend()}); on CPU, XLA_FLAGS=--xla_force_host_platform_device_count={shape.size} "
            "gives it that many"
        )
    return Mesh(np.array(devices[: shape.size]).reshape(shape.shape), AXES)


def _names(path) -> list[str]:
    return [str(getattr(k, "key", getattr(k, "name", k))) for k in path]


def _fits(mesh: Mesh, dim: int, axis: str | tuple[str, ...] | None):
    """``axis`` when its size divides ``dim`` (and is more than 1), else None (replicated)."""
    if axis is None:
        return None
    axes = (axis,) if isinstance(axis, str) else axis
    size = math.prod(mesh.shape[a] for a in axes)
    return axis if size > 1 and dim % size == 0 else None


def param_spec(mesh: Mesh, path, shape: tuple[int, ...]) -> PartitionSpec:
    """The ``PartitionSpec`` of the parameter (or optimizer moment) at ``path`` of ``shape``."""
    names = set(_names(path))
    if len(shape) != 2:
        return PartitionSpec()  # norm scales, biases, step counts: replicated
    rows, cols = shape
    if "embed_tokens" in names:  # [vocab, hidden]: the hidden dimension over fsdp
        return PartitionSpec(None, _fits(mesh, cols, "fsdp"))
    if names & ROW_PARALLEL:  # [intermediate or heads·head_dim, hidden]
        return PartitionSpec(_fits(mesh, rows, "model"), _fits(mesh, cols, "fsdp"))
    model = "model" if names & COLUMN_PARALLEL else None
    return PartitionSpec(_fits(mesh, rows, "fsdp"), _fits(mesh, cols, model))


def place(x, sharding: NamedSharding):
    """``x`` (a host array, or a device array of this process or of the whole gang) laid out by
    ``sharding``. A mesh that spans several processes (a trainer gang) gets each process's own
    shards from its copy of a host array, and a global array another layout through a compiled
    copy, since ``device_put`` moves only what this process can address."""
    if sharding.is_fully_addressable:
        return jax.device_put(x, sharding)
    if isinstance(x, jax.Array):
        return x if x.sharding == sharding else _reshard(x, sharding)
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def _reshard(x: jax.Array, sharding: NamedSharding) -> jax.Array:
    return jax.jit(lambda a: a, out_shardings=sharding)(x)


def shard_tree(mesh: Mesh | None, tree):
    """``tree`` (parameters or optimizer state, host or device arrays) placed on ``mesh`` by
    :func:`param_spec`, in one transfer; without a mesh, on the default device."""
    if mesh is None:
        return jax.tree.map(jnp.asarray, tree)
    return jax.tree_util.tree_map_with_path(
        lambda path, x: place(x, NamedSharding(mesh, param_spec(mesh, path, np.shape(x)))), tree
    )


def shard_rows(mesh: Mesh | None, tree):
    """Every array of ``tree`` whose leading dimension the row axes divide, split by rows over
    ``data`` and ``fsdp``; the others replicated. Without a mesh, on the default device."""
    if mesh is None:
        return jax.device_put(tree)

    def rows(x):
        spec = PartitionSpec(_fits(mesh, x.shape[0], ROWS)) if np.ndim(x) else PartitionSpec()
        return place(x, NamedSharding(mesh, spec))

    return jax.tree.map(rows, tree)


def to_host(x) -> np.ndarray:
    """The whole of ``x`` as a numpy array, also when its rows are spread over a gang."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)
