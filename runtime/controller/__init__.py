"""The event-sourced controller: a pure fold and decision function over the ledger, its I/O shell,
replay and the invariant checks I1–I9 (``invariants.NAMES``)."""

from runtime.controller.admit import DECISION_KINDS, INPUT_KINDS, admit
from runtime.controller.decide import decide, decide_and_fold, needed_versions
from runtime.controller.loop import ControllerFenced, ControllerLoop
from runtime.controller.reduce import InvalidEvent, fold, reduce
from runtime.controller.replay import ReplayDivergence, replay
from runtime.controller.spec import ControllerSpec, SpecError
from runtime.controller.state import INITIAL, ControllerState, Group, Plan, Request, Worker
from runtime.controller.workers import (
    InitTask,
    Lease,
    ScoreTask,
    TrainRollout,
    TrainTask,
    Verdict,
)

__all__ = [name for name in dir() if not name.startswith("_")]
