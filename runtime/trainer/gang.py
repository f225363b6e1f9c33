"""A trainer gang: one logical trainer run by P processes joined with ``jax.distributed``.

``workers.trainer_processes = P`` starts the trainer as P ``rlx worker trainer`` processes, rank 0
to P-1, that call ``jax.distributed.initialize`` against a coordinator rank 0 serves (gloo over
TCP for the collectives on CPU, the backend's own on a GPU or TPU, each rank over the devices the
run's layout gave it, ``runtime.placement``). Together they hold one device mesh (``trainer.mesh``, over every
device of the gang) and run each train step as one SPMD program:

- to the controller the gang is **one** trainer worker: rank 0 joins, polls, heartbeats and
  submits; it hands each task to the other ranks through the coordination service's key-value
  store (:meth:`Gang.hand_out`, :meth:`Gang.take`), numbered in order, so every rank runs the
  same steps in the same order;
- every rank writes its own shards of the parameters and optimizer state to the store, and
  rank 0 publishes the manifest last, after a barrier (``ParamStore.put`` with ``gang``);
- the gang is one failure domain: ``jax.distributed`` aborts every rank when one dies (a rank
  cannot rejoin a live gang), and the supervisor then starts the whole gang again, which
  re-derives the step from the ledger and the last published version.

Only the gang's ranks may reach its coordinator: ``jax.distributed``'s coordination service has
no authentication, and one ``RegisterTask`` from any process that can connect aborts every rank.
On one machine the coordinator is a Unix socket, ``unix:DIR/coordinator.sock`` in a directory
only its user can enter (the supervisor makes a fresh one per gang; rank 0 refuses one that others
can enter), so no other user's process can connect, and no TCP port is open for it. A gang across
machines names a ``HOST:PORT`` that rank 0 serves on that address only; that network must be
private to the gang (see the README).

A 2-device gang sums in the same order as one process with 2 devices (a two-party sum has one
order), so ``trainer.mesh={fsdp=2}`` gives the same bits either way; for more devices the
cross-process reduction orders differ from the in-process ones.
"""

from __future__ import annotations

import dataclasses
import os
import stat

import jax
import numpy as np

from runtime.errors import UsageError
from runtime.failpoints import failpoint
from runtime.placement import DEVICES_ENV

HEARTBEAT_S = 10  # a dead rank aborts the others within about this long
INIT_TIMEOUT_S = 120
BARRIER_TIMEOUT_MS = 600_000
_STOP = b"stop"
UNIX = "unix:"
MAX_SOCKET_PATH = 107  # bytes of sockaddr_un.sun_path, less its terminating NUL


@dataclasses.dataclass(frozen=True)
class GangSpec:
    """Where a process stands in its gang: ``rank`` of ``size``, and the coordinator's address,
    ``unix:PATH`` (a gang on one machine) or ``HOST:PORT``."""

    rank: int
    size: int
    coordinator: str

    @classmethod
    def parse(cls, gang: str, coordinator: str | None) -> GangSpec:
        """``RANK/SIZE`` (e.g. ``0/2``) and the coordinator; a bad value is a one-line error."""
        rank, sep, size = gang.partition("/")
        if not (sep and rank.isdigit() and size.isdigit() and int(rank) < int(size)):
            raise UsageError(f"--gang {gang!r} is not RANK/SIZE with 0 <= RANK < SIZE (e.g. 0/2)")
        address = coordinator or ""
        if address.startswith(UNIX):
            path = address[len(UNIX):]
            if not (os.path.isabs(path) and 0 < len(os.fsencode(path)) <= MAX_SOCKET_PATH):
                raise UsageError(f"--coordinator {coordinator!r}: a Unix socket's path must be absolute and at most "
                                 f"{MAX_SOCKET_PATH} bytes long (e.g. unix:/tmp/rlx-gang/coordinator.sock)")
            return cls(int(rank), int(size), address)
        host, sep, port = address.rpartition(":")
        if not (sep and host and port.isdigit() and 1 <= int(port) <= 65535):
            raise UsageError(f"--coordinator {coordinator!r} is not unix:PATH or HOST:PORT with 1 <= PORT <= 65535 "
                             "(e.g. 10.0.0.1:7100); a gang needs the address rank 0 serves its coordinator on")
        return cls(int(rank), int(size), address)

    @property
    def socket_path(self) -> str | None:
        """The coordinator's Unix socket, None for a ``HOST:PORT``."""
        return self.coordinator[len(UNIX):] if self.coordinator.startswith(UNIX) else None


def check_private(spec: GangSpec) -> None:
    """Rank 0 of a gang on a Unix socket: the socket's directory must be this user's alone (owned
    by it, no access for group or others), or another user's process could reach the coordinator.

    Raises:
        UsageError: naming the directory, its owner and mode.
    """
    path = spec.socket_path
    if path is None:
        return
    directory = os.path.dirname(path)
    try:
        st = os.stat(directory)
    except OSError as e:
        raise UsageError(f"--coordinator {spec.coordinator!r}: its directory {directory} cannot be used "
                         f"({e.strerror}); make one only you can enter (mkdir -m 700)") from e
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise UsageError(f"--coordinator {spec.coordinator!r}: its directory {directory} (owner uid {st.st_uid}, "
                         f"mode {stat.S_IMODE(st.st_mode):o}) is open to other users; the gang's socket needs a "
                         f"directory owned by uid {os.geteuid()} with mode 700")


class Gang:
    """This process's gang, once joined: its rank and the few things the ranks share."""

    def __init__(self, spec: GangSpec):
        from jax._src import distributed

        self.rank, self.size = spec.rank, spec.size
        # The coordination service's client (the key-value store and barriers JAX's own
        # multi-host utilities use); it lives as long as the process.
        client = distributed.global_state.client
        assert client is not None, "jax.distributed.initialize has not run"
        self._client = client
        self._sent = 0
        self._taken = 0
        self._barriers = 0

    @classmethod
    def join(cls, spec: GangSpec) -> Gang:
        """Join the gang; must run before anything in the process touches a JAX backend."""
        if spec.rank == 0:
            check_private(spec)
        local = None
        if gang_platform(os.environ) == "cpu":
            jax.config.update("jax_cpu_collectives_implementation", "gloo")  # over TCP on loopback
        else:  # the backend's own collectives (NCCL, ICI) over the devices the layout gave this rank
            ids = os.environ.get(DEVICES_ENV)
            local = list(range(len(ids.split(",")))) if ids else None
        # Rank 0 serves the coordinator on exactly the address given (JAX's default is every
        # interface): a private Unix socket for a gang on one machine.
        jax.distributed.initialize(coordinator_address=spec.coordinator, num_processes=spec.size,
                                   process_id=spec.rank, initialization_timeout=INIT_TIMEOUT_S,
                                   heartbeat_timeout_seconds=HEARTBEAT_S, coordinator_bind_address=spec.coordinator,
                                   local_device_ids=local)
        return cls(spec)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    # -- tasks, from rank 0 to the others -----------------------------------------------------

    def hand_out(self, payload: bytes) -> None:
        """Rank 0: the next task (its wire bytes) for the other ranks."""
        self._client.key_value_set_bytes(f"rlx/gang/task/{self._sent}", payload)
        self._sent += 1

    def stop(self) -> None:
        """Rank 0: the run has finished; the other ranks' :meth:`take` returns None."""
        self.hand_out(_STOP)

    def take(self, wait_s: float = 60.0) -> bytes | None:
        """The other ranks: the next task rank 0 handed out (waiting for it), None once it
        said stop. A dead rank 0 ends the process (``jax.distributed`` aborts it)."""
        key = f"rlx/gang/task/{self._taken}"
        while True:
            try:
                payload = self._client.blocking_key_value_get_bytes(key, int(wait_s * 1000))
                break
            except Exception as e:  # a timeout: rank 0 has had nothing to hand out yet
                if "DEADLINE_EXCEEDED" not in str(e) and "timed out" not in str(e).lower():
                    raise
        self._client.key_value_delete(key)
        self._taken += 1
        return None if payload == _STOP else payload

    # -- the store ----------------------------------------------------------------------------

    def barrier(self, name: str) -> None:
        """Wait until every rank reaches the barrier ``name`` (numbered: each call is a new one)."""
        self._barriers += 1
        self._client.wait_at_barrier(f"rlx/{name}/{self._barriers}", BARRIER_TIMEOUT_MS)

    def together(self, jitted, *args, **static) -> None:
        """Compile ``jitted`` for these arguments (``static``: its static ones) if it is not
        compiled yet, then wait for every rank, so that the ranks enter its collectives together.

        Gloo's collectives on the CPU give up on a rank that arrives more than 30 s after
        another (the first collective's context set-up and a reduce-scatter's TCP read time out,
        whatever XLA's collective timeout says),
        and compiling a train step for a new shape can take longer than that on a loaded host, by
        a different amount on each rank; the coordination service's barrier waits up to
        ``BARRIER_TIMEOUT_MS``. Compiling first fills ``jitted``'s own cache: the call that follows
        runs the same executable."""
        failpoint(f"gang.rank{self.rank}.compile")
        jitted.lower(*args, **static).compile()
        self.barrier("step")

    def gather(self, tree):
        """``tree`` of global arrays as whole numpy arrays, on every rank."""
        from jax.experimental import multihost_utils

        return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))

    @staticmethod
    def own_shards(array) -> list[tuple[tuple[slice, ...], np.ndarray]]:
        """The parts of the global ``array`` this rank writes: each of its shards held by no
        lower replica (so every element is written once)."""
        return [(shard.index, np.asarray(shard.data)) for shard in array.addressable_shards if shard.replica_id == 0]

    def shutdown(self) -> None:
        jax.distributed.shutdown()


def gang_platform(environ) -> str:
    """The platform a rank will run on, known before its JAX backend starts (the collectives must
    be chosen first): ``JAX_PLATFORMS`` as its layout set it, else the CPU where the machine has
    no accelerator."""
    from runtime.placement import accelerator_present

    first = environ.get("JAX_PLATFORMS", "").split(",")[0].strip()
    return first or ("accelerator" if accelerator_present() else "cpu")


def check_devices(gang: Gang | None, mesh_size: int) -> None:
    """A gang's mesh must span every device of the gang, so that each rank holds its part."""
    if gang is not None and mesh_size != jax.device_count():
        raise UsageError(
            f"trainer.mesh has {mesh_size} devices but the gang of {gang.size} processes has "
            f"{jax.device_count()} ({jax.local_device_count()} per process); set trainer.mesh to span all of them, "
            f"e.g. trainer.mesh={{fsdp={jax.device_count()}}}"
        )
