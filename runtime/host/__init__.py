"""Hosting a run: the controller's port and front, the one worker loop, the host and the thread
runner (the process runner is ``runtime.service.processes``)."""

from runtime.host.front import Front
from runtime.host.host import Host
from runtime.host.port import (
    AlreadyJoined,
    Busy,
    ControllerPort,
    Disconnected,
    Joined,
    Refused,
    RunInfo,
    Standing,
    Submitted,
    Work,
    WrongSecret,
)
from runtime.host.retire import Retirer
from runtime.host.threads import ThreadPort, ThreadRunner
from runtime.host.worker import run_worker

__all__ = ["AlreadyJoined", "Busy", "ControllerPort", "Disconnected", "Front", "Host", "Joined", "Refused",
           "Retirer", "RunInfo", "Standing", "Submitted", "ThreadPort", "ThreadRunner", "Work", "WrongSecret",
           "run_worker"]
