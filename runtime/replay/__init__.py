"""Replaying a run from its ledger: re-derive every weight version (and, on request, every
rollout) and compare the bits with what the run logged."""

from runtime.replay.divergence import Divergence, compare_rollout, compare_step, fingerprint_diff
from runtime.replay.plan import (
    IncompleteLedger,
    ReplayIndex,
    ReplayPlan,
    Sampled,
    SampledRollout,
    StepPlan,
    index_run,
    plan_replay,
    replay_start,
    stream_replay,
)
from runtime.replay.report import ReplayReport
from runtime.replay.runner import replay_run
from runtime.replay.source import RunLedger, open_params, read_run

__all__ = [
    "Divergence",
    "IncompleteLedger",
    "ReplayIndex",
    "ReplayPlan",
    "ReplayReport",
    "RunLedger",
    "Sampled",
    "SampledRollout",
    "StepPlan",
    "compare_rollout",
    "compare_step",
    "fingerprint_diff",
    "index_run",
    "open_params",
    "plan_replay",
    "read_run",
    "replay_run",
    "replay_start",
    "stream_replay",
]
