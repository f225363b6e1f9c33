"""A fresh controller behind a ``Front`` (memory ledger, a clock the test moves) and a port of one
runner's kind to it: the front itself for ``"threads"``, gRPC on loopback for any other runner."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from ledger import open_store
from ledger.codec import encode_event
from runtime.config import load_config
from runtime.controller import ControllerLoop
from runtime.errors import RlxError
from runtime.host import Front, admission
from runtime.host.threads import ThreadPort
from runtime.service.client import ControllerClient
from runtime.service.server import ControllerService, serve
from verifiers.service.security import ListenAddress


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Hosted:
    """The controller of run ``"r"`` made from ``overrides``, its front and a port of ``runner``'s kind.

    ``lease_timeout_s``: the controller's (its default when None); ``front_config``: the config the
    front describes (the run's when None); ``bounded``: the front admits by the run's bounds."""

    def __init__(self, runner: str, overrides: Sequence[str], *, params=None, lease_timeout_s: float | None = None,
                 front_config: dict | None = None, bounded: bool = False):
        self.config = load_config(None, list(overrides), data_size=8)
        self.store, self.clock = open_store("memory://"), Clock()
        timeout = {} if lease_timeout_s is None else {"lease_timeout_s": lease_timeout_s}
        self.loop = ControllerLoop.create(self.store, run_id="r", config=self.config.to_dict(),
                                          config_digest=self.config.digest(), seed=1, clock=self.clock, **timeout)
        self.params = params
        bounds = {"bounds": admission.bounds(self.config)} if bounded else {}
        self.front = Front(self.loop, config=self.config.to_dict() if front_config is None else front_config,
                           params_url="memory://params", params=params, **bounds)
        self.served = None
        self.port = ThreadPort(self.front)
        if runner != "threads":
            self.served = serve(ControllerService(self.front), ListenAddress("127.0.0.1", 0))
            self.port = ControllerClient([f"127.0.0.1:{self.served.port}"])

    def ledger(self) -> list[tuple]:
        return [encode_event(s.event) for s in self.store.read("r")]

    def head(self) -> int:
        return self.store.head("r").seq

    def close(self):
        if self.served is not None:
            self.port.close()
            self.served.stop(0)


@contextlib.contextmanager
def hosts(overrides: Sequence[str], **options) -> Iterator:
    """A maker of ``Hosted(runner, overrides, **options)`` (``params=`` per call too); closes them all."""
    made: list[Hosted] = []

    def make(runner: str, params=None) -> Hosted:
        made.append(Hosted(runner, overrides, params=params, **options))
        return made[-1]

    try:
        yield make
    finally:
        for h in made:
            h.close()


def refusal(call) -> str:
    """The one-line reason a call was refused, as the port gives it ("" if it was not)."""
    try:
        call()
    except RlxError as e:
        return str(e).rsplit("INVALID_ARGUMENT: ", 1)[-1]
    return ""
