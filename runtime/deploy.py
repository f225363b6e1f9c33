"""``rlx controller``: one run's controller served to worker processes on other machines.

The controller is the fold of the ledger and holds its writer epoch; it keeps nothing else. Given
a ledger that does not hold the run, it creates it from the config; given one that does, it
continues it under a new epoch, so a controller that was killed (or is still running somewhere,
paused or cut off) is replaced: the old one is fenced at its next append or epoch check, and the
workers, which retry and fail over between addresses, join the new one. The service has no
supervisor: starting and restarting workers is the cluster's job (Kubernetes, Slurm, systemd).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable

from ledger import open_store
from runtime.config import Config
from runtime.errors import UsageError

FINISH_GRACE_S = 3.0  # how long a finished controller keeps answering, so its workers hear it
TOKEN_FILE = "controller.token"
"""Where a controller given no token keeps the one it made: beside a SQLite ledger, else in the
current directory (``--token-out`` says otherwise)."""


def serve_controller(ledger_url: str, params_url: str, address, security, *, run_id: str | None,
                     config: Config, config_given: bool = True, token_out: str | None = None,
                     log: Callable[[str], None] | None = None,
                     announce: Callable[[dict], None] | None = None) -> dict:
    """Create or continue the run and serve it until it finishes; returns its final version.

    ``config`` is the run's config when the ledger does not hold it (``run.name`` is ``run_id``
    when one is given); a run the ledger holds goes on with its logged config, and a
    ``config_given`` by the user that differs from it is refused, naming the fields. Everything
    is checked, and the address bound, before the ledger or the parameter store is created or
    the run recorded. Given no token (``security.token``), the controller makes one and keeps it
    in ``token_out`` (see :func:`kept_token`), so its workers and its successors on this machine
    use the same.

    ``announce`` is called once the service listens, with ``{"listening", "run", "epoch",
    "token_file"}`` (by default printed as one JSON line on stdout, so a script can read a port
    chosen by the system)."""
    import json

    from runtime.host import Host
    from runtime.service.server import ControllerService, PendingService, serve
    from runtime.session import fingerprint

    say = log or (lambda m: print(f"rlx controller: {m}", file=sys.stderr, flush=True))
    security.check(address)
    if (cleartext := security.cleartext(address)) is not None:
        say(cleartext)
    name = run_id or config.run.name
    _check_stores(ledger_url, params_url)
    if name in _held_runs(ledger_url):
        if config_given:
            _check_same_config(ledger_url, name, config)
    else:
        _resolved(config)  # the task and its data are read now, not once the run is recorded
    token_file, made = None, False
    if security.token is None:
        token_file = token_out or default_token_file(ledger_url)
        made = not os.path.lexists(token_file)
        security = dataclasses.replace(security, token=kept_token(token_file))
    pending = PendingService()
    try:
        served = serve(pending, address, security)  # a port in use is refused before the run is recorded
    except BaseException:
        if made and token_file is not None:
            os.remove(token_file)
        raise
    try:
        with open_store(ledger_url, create=True) as store:
            host = Host.open(store, params_url, run_id=run_id, config=lambda: config, fingerprint=fingerprint(),
                             log=say)
            ctrl = host.ctrl
            if ctrl.finished:
                return _final(ctrl)
            host.observe()  # no evaluator: this process builds no model
            try:
                pending.attach(ControllerService(host.front))
                host_name = address.target.rsplit(":", 1)[0]
                listening = f"{host_name}:{served.port}"
                if token_file is not None:
                    say(f"no token was given: workers use the one in {token_file} (mode 0600), e.g. "
                        f"`rlx worker inference --controller {listening} --token-file {token_file}`")
                (announce or (lambda d: print(json.dumps(d, sort_keys=True), flush=True)))(
                    {"listening": listening, "run": ctrl.run_id, "epoch": ctrl.epoch, "token_file": token_file})
                host.watch(progress=False)
                time.sleep(FINISH_GRACE_S)
            finally:
                served.stop()
                host.close(finished=ctrl.finished)
            say(f"run {ctrl.run_id!r} finished at version {ctrl.state.latest}")
            return _final(ctrl)
    finally:
        served.stop()  # again, harmless, when the run had finished or could not be opened


def default_token_file(ledger_url: str) -> str:
    """``controller.token`` beside a SQLite ledger file, else in the current directory."""
    path = _sqlite_path(ledger_url)
    return os.path.join(os.path.dirname(path) if path is not None else os.curdir, TOKEN_FILE)


def kept_token(path: str) -> str:
    """The token in ``path``, made now (random, mode 0600) when the file does not exist; a file
    that others than its owner could read, or that is not this user's, is refused."""
    import secrets
    import stat

    from verifiers.service.security import load_token

    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise UsageError(f"token file {path!r} must be a regular file of this user that only they can read "
                             f"(mode 0600; it is {stat.filemode(info.st_mode)}); fix it or remove it") from None
        token = load_token(path)
        assert token is not None
        return token
    except OSError as e:
        raise UsageError(f"cannot write the controller's token to {path!r}: {e.strerror}; "
                         "give --token-out, --token-file or $RLX_TOKEN") from None
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(token + "\n")
    return token


def _sqlite_path(ledger_url: str) -> str | None:
    from ledger.url import resolve_url

    url = resolve_url(ledger_url)
    return url[len("sqlite:///"):] if url.startswith("sqlite:///") else None


def _check_stores(ledger_url: str, params_url: str) -> None:
    """Refuse a ledger file or parameter store directory that could not be made, before either is."""
    from runtime.params.location import parse_location
    from runtime.rundir import check_creatable

    path = _sqlite_path(ledger_url)
    if path is not None:
        if os.path.isdir(path):
            raise UsageError(f"--ledger {ledger_url!r} is a directory that holds no ledger; give a ledger file")
        if not os.path.exists(path):
            check_creatable(path, "--ledger", directory=False)
    directory = parse_location(params_url).directory
    if directory is not None:
        check_creatable(directory, "--params")


def _held_runs(ledger_url: str) -> list[str]:
    """The runs of the ledger; an absent SQLite file holds none (and is not created)."""
    path = _sqlite_path(ledger_url)
    if path is not None and not os.path.exists(path):
        return []
    with open_store(ledger_url, readonly=path is not None, create=path is None) as store:
        return store.runs()


def _resolved(config: Config) -> Config:
    from runtime.session import make_task, resolve

    return resolve(config, make_task(config))


def _check_same_config(ledger_url: str, run_id: str, config: Config) -> None:
    """Refuse a config the user gave for a run the ledger holds when it differs from the logged
    one: the run goes on with its logged config, and a ``--steps`` or ``--set`` silently
    ignored would mislead."""
    from runtime.rundir import run_started

    with open_store(ledger_url, readonly=_sqlite_path(ledger_url) is not None) as store:
        logged = Config.from_dict(run_started(store, run_id).config).to_dict()
    given = _resolved(config).to_dict()
    changed = sorted(f"{section}.{field}" for section in given for field in given[section]
                     if given[section][field] != logged.get(section, {}).get(field))
    if changed:
        shown = ", ".join(f"{k} (logged {_at(logged, k)!r}, given {_at(given, k)!r})" for k in changed[:5])
        raise UsageError(f"run {run_id!r} is in the ledger already and goes on with its logged config, which the "
                         f"config given differs from: {shown}{' …' if len(changed) > 5 else ''}; give the same "
                         "config, or none")


def _at(config: dict, key: str):
    section, field = key.split(".", 1)
    return config.get(section, {}).get(field)


def _final(ctrl) -> dict:
    s = ctrl.state
    return {"run": ctrl.run_id, "finished": s.finished, "final_version": s.latest,
            "final_digest": s.versions.get(s.latest, ""), "epoch": ctrl.epoch}
