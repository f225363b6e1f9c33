"""``rlx worker ROLE``: one stateless worker process of a run, served by a controller over gRPC.

The worker asks the controller which run it serves (its logged config and parameter store),
builds what its role needs from that config alone (``runtime.host.roles.role_from_config``) and
runs the one worker loop (``runtime.host.worker.run_worker``) against the controller through a
``ControllerClient``: the same loop, joins and admission rules as a worker thread of ``rlx run``.
Weights are read by version and checked against the digest the ledger names; nothing else is
kept between calls but caches.
"""

from __future__ import annotations

import gc
import sys
import threading
import time

from runtime.config import Config
from runtime.host.port import Disconnected, Standing
from runtime.host.roles import role_from_config
from runtime.host.worker import Backoff, Log, retry_later, run_worker
from runtime.service.client import ControllerClient


def serve_run(role: str, client: ControllerClient, *, worker_id: str, log: Log = print,
              retry_for_s: float = 600.0, gang=None) -> int:
    """Serve the run of the controller ``client`` reaches until it finishes; returns 0 then.

    ``gang`` (``runtime.trainer.gang.Gang``, trainers only): rank 0 serves as the gang's one
    trainer worker and hands each task to the other ranks, which only follow it.
    """
    backoff = Backoff(retry_for_s)
    while True:
        try:
            info = client.describe()
            break
        except Disconnected as e:
            retry_later(client, backoff, e)
    backoff.reset()
    if info.standing == Standing.FINISHED:
        log(f"run {info.run_id!r} has finished; nothing to do")
        return 0
    work = role_from_config(role, Config.from_dict(info.config), info.params_url, log, gang)
    gc.freeze()  # the model, engine and compiled programs live as long as the process
    if gang is not None:
        gang.barrier("ready")  # every rank built, however long its start took: no rank is late to a collective
        if not gang.leader:
            return work.follow(log)  # type: ignore[attr-defined]
    beat = client.twin()  # heartbeats do not wait behind a long poll
    try:
        code = run_worker(work, client, worker_id=worker_id, run_id=info.run_id, heartbeat_s=info.heartbeat_s,
                          log=log, backoff=backoff, beat_port=beat)
    finally:
        beat.close()
    if gang is not None:
        gang.stop()
    return code


def exit_with_parent(period_s: float = 0.5) -> None:
    """Exit (status 1) as soon as the parent process is gone: a worker of a killed ``rlx run``
    does not outlive it."""
    import os

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(period_s)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(role: str, targets: list[str], *, worker_id: str | None, token: str | None, tls: dict,
         retry_for_s: float, gang_spec=None) -> int:
    """One worker process; with ``gang_spec`` (``runtime.trainer.gang.GangSpec``), one rank of a
    trainer gang, joined before anything else touches JAX."""
    import os
    import socket

    gang = None
    if gang_spec is not None:
        from runtime.trainer.gang import Gang

        gang = Gang.join(gang_spec)
    client = ControllerClient(targets, token=token, **tls)
    wid = worker_id or f"{role}-{socket.gethostname()}-{os.getpid()}"

    def log(message: str) -> None:
        print(f"rlx worker {role}: {message}", file=sys.stderr, flush=True)

    try:
        code = serve_run(role, client, worker_id=wid, log=log, retry_for_s=retry_for_s, gang=gang)
    finally:
        client.close()
    if gang is not None:
        gang.shutdown()  # waits for every rank: rank 0 serves the coordinator until the others are done
    return code
