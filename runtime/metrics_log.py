"""TensorBoard event files of a run (``--set log.tensorboard=DIR``), beside the ledger.

The ledger stays the record; these files are a view of it for people who watch runs in
TensorBoard, written through ``tensorboardX`` (a small writer of TensorBoard's event format that
needs neither TensorFlow nor PyTorch). :class:`TensorBoardLog` listens to the controller's commits
(``ControllerLoop.on_commit``), where it only builds summaries for the writer's queue: the
writer's own thread writes the files. Scalars, by tag:

- ``train/<metric>`` at step ``s``: every metric of step ``s``'s ``TrainStepCompleted`` (loss,
  KL, entropy, staleness, the train batch's ``reward_mean`` and ``pass_rate``, …);
- ``rollout/reward_mean``, ``rollout/pass_rate`` at the newest trained step: the outcomes
  recorded since the previous step committed (what the verifiers saw, before batching);
- ``throughput/steps_per_min`` at step ``s``: over the last ``RATE_WINDOW`` steps (the first step:
  since the log started);
- ``eval/greedy_pass_rate``, ``eval/pass_at_k``, ``eval/sampled_pass_rate`` at step ``v``: the
  ``VersionEvaluated`` of version ``v`` (the weights after step ``v``).

Wall times are when the controller committed each event.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ledger import events as ev
from runtime.errors import UsageError

Clock = Callable[[], float]

EVAL_TAGS = ("greedy_pass_rate", "pass_at_k", "sampled_pass_rate")
RATE_WINDOW = 10  # steps/min is measured over the last this many steps


class TensorBoardLog:
    """Writes a run's scalars to TensorBoard event files in ``logdir`` (see the module docstring)."""

    def __init__(self, logdir: str, *, clock: Clock = time.time) -> None:
        from tensorboardX import SummaryWriter

        try:
            self.writer = SummaryWriter(logdir=logdir, flush_secs=10)
        except OSError as e:
            raise UsageError(f"log.tensorboard {logdir!r} cannot be written: {e.strerror or e}") from None
        self.logdir = logdir
        self.clock = clock
        self._lock = threading.Lock()
        self._closed = False
        self._t0: float | None = None
        self._recent: collections.deque[tuple[int, float]] = collections.deque(maxlen=RATE_WINDOW + 1)
        self._step = 0
        self._rewards: list[float] = []
        self._passed: list[bool] = []

    def observe(self, events: Sequence[ev.Event]) -> None:
        """The controller's commit hook: hand the scalars of ``events`` to the writer's queue."""
        kept = [e for e in events if type(e) in _SHOWN]
        if kept:
            now = self.clock()
            with self._lock:
                if self._closed:
                    return
                for e in kept:
                    self._write(now, e)

    def close(self) -> None:
        """Write everything handed over so far and close the files."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self.writer.close()

    def _scalar(self, tag: str, value: Any, step: int, wall: float) -> None:
        self.writer.add_scalar(tag, float(value), global_step=step, walltime=wall)

    def _write(self, wall: float, e: ev.Event) -> None:
        if self._t0 is None:
            self._t0 = wall
        if type(e) is ev.OutcomeRecorded:
            self._rewards.append(float(e.reward))
            self._passed.append(bool(e.passed))
        elif type(e) is ev.TrainStepCompleted:
            s = self._step = e.step
            for name, value in sorted(e.metrics.items()):
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._scalar(f"train/{name}", value, s, wall)
            if self._rewards:
                self._scalar("rollout/reward_mean", sum(self._rewards) / len(self._rewards), s, wall)
                self._scalar("rollout/pass_rate", sum(self._passed) / len(self._passed), s, wall)
                self._rewards, self._passed = [], []
            if not self._recent:  # the first step: since the log started
                self._recent.append((s - 1, self._t0))
            self._recent.append((s, wall))
            first_step, first_wall = self._recent[0]
            if wall > first_wall:
                self._scalar("throughput/steps_per_min", 60.0 * (s - first_step) / (wall - first_wall), s, wall)
        elif type(e) is ev.VersionEvaluated:
            for name in EVAL_TAGS:
                self._scalar(f"eval/{name}", getattr(e, name), e.version, wall)


_SHOWN = frozenset({ev.OutcomeRecorded, ev.TrainStepCompleted, ev.VersionEvaluated})


__all__ = ["TensorBoardLog"]
