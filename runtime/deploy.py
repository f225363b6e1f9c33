"""``rlx controller``: one run's controller served to worker processes on other machines.

The controller is the fold of the ledger and holds its writer epoch; it keeps nothing else. Given
a ledger that does not hold the run, it creates it from the config; given one that does, it
continues it under a new epoch, so a controller that was killed (or is still running somewhere,
paused or cut off) is replaced: the old one is fenced at its next append or epoch check, and the
workers, which retry and fail over between addresses, join the new one. The service has no
supervisor: starting and restarting workers is the cluster's job (Kubernetes, Slurm, systemd).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from ledger import open_store
from ledger.errors import CorruptLedger
from runtime.config import Config
from runtime.errors import UsageError

FINISH_GRACE_S = 3.0  # how long a finished controller keeps answering, so its workers hear it


def serve_controller(ledger_url: str, params_url: str, address, security, *, run_id: str | None,
                     config: Callable[[], Config], log: Callable[[str], None] | None = None,
                     announce: Callable[[dict], None] | None = None) -> dict:
    """Create or continue the run and serve it until it finishes; returns its final version.

    ``announce`` is called once the service listens, with ``{"listening", "run", "epoch"}``
    (by default printed as one JSON line on stdout, so a script can read a port chosen by the
    system)."""
    import json

    from runtime.controller import ControllerLoop
    from runtime.params import ParamStore
    from runtime.run import _Retirer
    from runtime.rundir import run_started
    from runtime.service.server import ControllerService, serve
    from runtime.session import build_codec, fingerprint, make_task

    say = log or (lambda m: print(f"rlx controller: {m}", file=sys.stderr, flush=True))
    security.check(address)
    store = open_store(ledger_url, create=True)
    try:
        fresh = None
        if run_id is not None and run_id in store.runs():
            name = run_id
        else:
            fresh = config()  # its run.name is run_id when one is given
            name = fresh.run.name
        if name in store.runs():
            cfg = Config.from_dict(run_started(store, name).config)
            # No ``pstore.sweep()`` here, unlike ``rlx resume``: the controller being replaced does
            # not take the workers with it, and a trainer's put in flight looks exactly like a
            # killed put's leftovers; sweeping would delete arrays it has written and is about to
            # publish. What a killed put leaves is rewritten when its step is trained again (the same
            # weights go under the same keys).
            pstore = ParamStore.open(params_url)
            retirer = _Retirer(pstore)
            try:  # from the newest usable snapshot; the tail is chain-checked as it is folded
                ctrl = ControllerLoop.resume(store, name, check=False, fingerprint=fingerprint(), warn=say,
                                             lease_timeout_s=cfg.workers.lease_timeout_s, on_retire=retirer,
                                             snapshot_every=cfg.ledger.snapshot_every)
            except CorruptLedger as e:
                raise UsageError(f"ledger of run {name!r} is corrupt at seq {e.seq}: {e.reason}") from None
            for v in ctrl.evictable_versions(pstore.versions()):
                pstore.delete(v)
            say(f"continuing run {name!r} at step {ctrl.state.trained} (writer epoch {ctrl.epoch})")
        else:
            assert fresh is not None
            cfg = fresh.resolved(data_size=make_task(fresh).train_size,
                                 chat_template_digest=build_codec(fresh).template_digest)
            pstore = ParamStore.open(params_url, create=True)
            retirer = _Retirer(pstore)
            ctrl = ControllerLoop.create(store, run_id=name, config=cfg.to_dict(), config_digest=cfg.digest(),
                                         seed=cfg.run.seed, fingerprint=fingerprint(),
                                         lease_timeout_s=cfg.workers.lease_timeout_s, on_retire=retirer,
                                         snapshot_every=cfg.ledger.snapshot_every, warn=say)
            say(f"created run {name!r} (writer epoch {ctrl.epoch})")
        if ctrl.finished:
            return _final(ctrl)

        service = ControllerService(ctrl, config=cfg.to_dict(), params_url=pstore.url, params=pstore)
        served = serve(service, address, security)
        host = address.target.rsplit(":", 1)[0]
        (announce or (lambda d: print(json.dumps(d, sort_keys=True), flush=True)))(
            {"listening": f"{host}:{served.port}", "run": name, "epoch": ctrl.epoch})
        try:
            last = time.monotonic()
            while not ctrl.finished:
                time.sleep(0.2)
                retirer.sweep()
                if time.monotonic() - last >= 1.0:
                    last = time.monotonic()
                    ctrl.check_fenced()
                    ctrl.expire()
            retirer.sweep()
            time.sleep(FINISH_GRACE_S)
        finally:
            served.stop()
        say(f"run {name!r} finished at version {ctrl.state.latest}")
        return _final(ctrl)
    finally:
        store.close()


def _final(ctrl) -> dict:
    s = ctrl.state
    return {"run": ctrl.run_id, "finished": s.finished, "final_version": s.latest,
            "final_digest": s.versions.get(s.latest, ""), "epoch": ctrl.epoch}
