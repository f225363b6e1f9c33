"""Which inputs from the outside world enter the ledger: ``admit(state, event) -> reason | None``.

The I/O loop admits each input against the state folded so far and appends only admitted
ones; a rejected input is answered to its sender and never written. So the ledger holds
exactly one completion per request (I4): a duplicate from a zombie worker, a completion that
arrives after its group was discarded or consumed, or one produced from other weights than the
request names is dropped here. Audit checks the same rules over a ledger
(``runtime.controller.invariants``), so an edited ledger cannot hide a second completion.

Work may therefore run more than once (a lease expires, the request is leased again, both
workers finish); its completion is recorded once, whichever valid one arrives first. Rollouts
are pure functions of (weights, prompt, sampling, seed), so which one wins does not matter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

import numpy as np

from ledger import events as ev
from runtime.controller.spec import ControllerSpec
from runtime.controller.state import Request

_K = TypeVar("_K", contravariant=True)
_V = TypeVar("_V", covariant=True)


class Lookup(Protocol[_K, _V]):
    """What the guards read of a map: a ``Map`` or a ``MapMutation``."""

    def get(self, key: _K, /) -> _V | None: ...
    def __getitem__(self, key: _K, /) -> _V: ...
    def __contains__(self, key: object, /) -> bool: ...


class StateView(Protocol):
    """What the guards read of a state: a ``ControllerState`` or a draft of one being folded."""

    @property
    def spec(self) -> ControllerSpec | None: ...
    @property
    def epoch(self) -> int: ...
    @property
    def finished(self) -> bool: ...
    @property
    def next_rollout_id(self) -> int: ...
    @property
    def formed(self) -> int: ...
    @property
    def trained(self) -> int: ...
    @property
    def latest(self) -> int: ...
    @property
    def versions(self) -> Lookup[int, str]: ...
    @property
    def requests(self) -> Lookup[int, Request]: ...
    @property
    def workers(self) -> Lookup[str, object]: ...
    @property
    def due_evaluations(self) -> tuple[tuple[int, str], ...]: ...


INPUT_KINDS = frozenset({
    ev.RunStarted, ev.RunForked, ev.ControllerStarted, ev.WorkerJoined, ev.WorkerLost, ev.RolloutCompleted,
    ev.RolloutAbandoned, ev.OutcomeRecorded, ev.TrainStepCompleted, ev.WeightsPublished, ev.VersionEvaluated,
    ev.SnapshotTaken,
})
"""Event kinds that enter from outside (workers, the clock, the shell, the evaluator)."""

DECISION_KINDS = frozenset({
    ev.PromptsSampled, ev.RolloutRequested, ev.RolloutAssigned, ev.GroupDiscarded,
    ev.BatchFormed, ev.VersionsRetired, ev.RunFinished,
})
"""Event kinds only ``decide`` emits."""


def _request_problem(s: StateView, rollout_id: int) -> str | None:
    if rollout_id in s.requests:
        return None
    if 0 <= rollout_id < s.next_rollout_id:
        return f"rollout {rollout_id} is no longer live (its group was consumed or discarded)"
    return f"rollout {rollout_id} was never requested"


def _completion(s: StateView, e: ev.RolloutCompleted) -> str | None:
    problem = _request_problem(s, e.rollout_id)
    if problem:
        return problem
    r = s.requests[e.rollout_id]
    if r.done:
        return f"rollout {e.rollout_id} already has an accepted completion (duplicate)"
    if not 0 <= e.attempt < r.attempts:
        return f"rollout {e.rollout_id} has no lease attempt {e.attempt} (leases so far: {r.attempts})"
    if e.policy_version != r.policy_version:
        return f"rollout {e.rollout_id} was requested from version {r.policy_version}, not {e.policy_version}"
    if e.weights_digest != s.versions.get(r.policy_version):
        return f"rollout {e.rollout_id}: weights digest {e.weights_digest[:16]}… is not version {r.policy_version}'s"
    return None


def _outcome(s: StateView, e: ev.OutcomeRecorded) -> str | None:
    problem = _request_problem(s, e.rollout_id)
    if problem:
        return problem
    r = s.requests[e.rollout_id]
    if not r.done:
        return f"rollout {e.rollout_id} has no accepted completion to score"
    if r.reward is not None:
        return f"rollout {e.rollout_id} is already scored (duplicate)"
    return None


def _abandoned(s: StateView, e: ev.RolloutAbandoned) -> str | None:
    r = s.requests.get(e.rollout_id)
    if r is None or r.done or r.holder is None or e.attempt != r.attempts - 1:
        return f"attempt {e.attempt} of rollout {e.rollout_id} is not an outstanding lease"
    return None


def _train_step(s: StateView, e: ev.TrainStepCompleted) -> str | None:
    if e.step <= s.trained:
        return f"step {e.step} is already trained (duplicate)"
    if e.step != s.trained + 1 or e.step > s.formed or s.latest != e.step - 1:
        return f"step {e.step} cannot complete now (trained {s.trained}, formed {s.formed}, latest {s.latest})"
    return None


def _weights(s: StateView, e: ev.WeightsPublished) -> str | None:
    if e.version <= s.latest:
        return f"version {e.version} is already published (duplicate)"
    if e.version != s.latest + 1 or (e.version > 0 and e.version != s.trained):
        return f"version {e.version} cannot be published now (latest {s.latest}, trained {s.trained})"
    if e.version > 0 and (e.parent_version != e.version - 1 or e.parent_digest != s.versions.get(e.version - 1)):
        return f"version {e.version} does not name version {e.version - 1} and its digest as parent"
    return None


def _evaluated(s: StateView, e: ev.VersionEvaluated) -> str | None:
    v = e.version
    digest = next((d for version, d in s.due_evaluations if version == v), None)
    if digest is None:
        if not 0 <= v <= s.latest:
            return f"version {v} is not published (latest {s.latest})"
        return f"version {v} has no evaluation due (evaluated already, or not due under eval.every_steps)"
    if e.digest != digest:
        return f"version {v}: weights digest {e.digest[:16]}… is not the one published ({digest[:16]}…)"
    if not (1 <= e.problems and 1 <= e.k <= e.samples):
        return f"version {v}: {e.problems} problems, k {e.k} of {e.samples} samples; needs problems >= 1, 1 <= k <= samples"
    for name in ("greedy_pass_rate", "pass_at_k", "sampled_pass_rate"):
        rate = getattr(e, name)
        if type(rate) is not float or not 0.0 <= rate <= 1.0:
            return f"version {v}: {name} {rate!r} is not a rate in [0, 1]"
    return None


def _worker_joined(s: StateView, e: ev.WorkerJoined) -> str | None:
    if e.worker_id in s.workers:
        return f"worker {e.worker_id!r} is already joined"
    if e.slots < 1:
        return f"worker {e.worker_id!r} joins with {e.slots} slots; at least 1 is needed"
    return None


def _worker_lost(s: StateView, e: ev.WorkerLost) -> str | None:
    return None if e.worker_id in s.workers else f"worker {e.worker_id!r} is not joined"


def _run_started(s: StateView, e: ev.RunStarted) -> str | None:
    return "the run has already started" if s.spec is not None else None


def _run_forked(s: StateView, e: ev.RunForked) -> str | None:
    return "the run is finished" if s.finished else None


def _controller_started(s: StateView, e: ev.ControllerStarted) -> str | None:
    return f"epoch {e.epoch} is not above {s.epoch}" if e.epoch <= s.epoch else None


def _snapshot_taken(s: StateView, e: ev.SnapshotTaken) -> str | None:
    return None  # the controller's own note beside its fold: it changes nothing


# Each guard takes a state and an input of its key's kind.
_GUARDS: dict[type, Callable[[StateView, Any], str | None]] = {
    ev.RunStarted: _run_started,
    ev.RunForked: _run_forked,
    ev.ControllerStarted: _controller_started,
    ev.SnapshotTaken: _snapshot_taken,
    ev.WorkerJoined: _worker_joined,
    ev.WorkerLost: _worker_lost,
    ev.RolloutCompleted: _completion,
    ev.RolloutAbandoned: _abandoned,
    ev.OutcomeRecorded: _outcome,
    ev.TrainStepCompleted: _train_step,
    ev.WeightsPublished: _weights,
    ev.VersionEvaluated: _evaluated,
}
assert frozenset(_GUARDS) == INPUT_KINDS
_AFTER_FINISH = frozenset({ev.RolloutCompleted, ev.OutcomeRecorded, ev.RolloutAbandoned})


def guard(state: StateView, event: ev.Event) -> str | None:
    """Why input ``event`` cannot follow ``state``, or None: the one check of each input kind,
    run by :func:`admit` before an input is appended and by ``reduce`` when it is folded."""
    kind = type(event)
    if state.spec is None and kind is not ev.RunStarted:
        return "the run has not started"
    if state.finished and kind in _AFTER_FINISH:
        return "the run is finished"
    return _GUARDS[kind](state, event)


def admit(state: StateView, event: ev.Event) -> str | None:
    """None if ``event`` may be appended after ``state``, else why it is rejected (one line).

    ``state`` is a ``ControllerState`` or the draft of one being folded (``reduce.Folder``):
    only attributes, ``get``, ``[]`` and ``in`` on its maps are read.
    """
    if type(event) not in INPUT_KINDS:
        return f"{event.KIND} is decided by the controller, not submitted"
    return guard(state, event)


def publication(events: Sequence[ev.Event]) -> str | None:
    """Why ``events`` are not one trainer result, or None: a train step's ``TrainStepCompleted``
    and ``WeightsPublished`` of the same step, together, or ``WeightsPublished`` 0 alone. A step
    completed without its weights (or the other way round) would leave no step to hand out."""
    kinds = [type(e) for e in events]
    if kinds == [ev.WeightsPublished] and events[0].version == 0:  # type: ignore[attr-defined]
        return None
    if kinds == [ev.TrainStepCompleted, ev.WeightsPublished] and events[0].step == events[1].version:  # type: ignore[attr-defined]
        return None
    got = ", ".join(f"{e.KIND} {getattr(e, 'step', getattr(e, 'version', '?'))}" for e in events[:4])
    more = ", …" if len(events) > 4 else ""
    return ("a trainer submits a step's TrainStepCompleted and WeightsPublished of the same step together, or "
            f"WeightsPublished 0 alone; got: {got or 'nothing'}{more}")


# -- values -----------------------------------------------------------------------------------
# What an input's numbers may be, beyond their types. The host's admission refuses an input out
# of range before the controller sees it (``runtime.host.admission``) and audit flags one that a
# ledger holds (``runtime.controller.invariants``); the fold does not check them, since the
# model's vocabulary is not in the ledger.

REWARD_RANGE = (0.0, 1.0)
"""Every task's rewards lie in ``[0, 1]``: ``Task.reward`` gives 1 for a pass and 0 or partial
credit (a fraction of the tests passed) otherwise; a passed outcome earns the top of the range."""
FINISH_STOP, FINISH_LENGTH = "stop", "length"
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class Bounds(NamedTuple):
    """The run's limits on a completion: the model's vocabulary (token ids in ``[0,
    vocab_size)``), ``sampling.max_tokens`` and whether its rollouts are multi-turn episodes
    (``episodes.tools`` named). None: not known here (token ids are then only checked to be >= 0,
    lengths not at all, turns only for their form)."""

    vocab_size: int | None = None
    max_tokens: int | None = None
    episodes: bool | None = None


UNBOUNDED = Bounds()
"""No known limit: token ids only checked to be >= 0, lengths not at all."""


def completion_values(e: ev.RolloutCompleted, bounds: Bounds) -> str | None:
    """Why completion ``e``'s tokens, log-probs or finish reason cannot come from the run's
    engine, or None. The engine generates 1 to ``max_tokens`` tokens, each below the vocabulary
    size with a finite log-prob <= 0; it finishes with ``"stop"`` on a stop token (kept as the
    last token, at any length up to ``max_tokens``) and with ``"length"`` only at ``max_tokens``."""
    rid, tokens, logprobs = e.rollout_id, e.tokens, e.logprobs
    n = len(tokens)
    if n == 0:
        return f"rollout {rid}: a completion has at least one token"
    low, high = int(tokens.min()), int(tokens.max())
    vocab = bounds.vocab_size
    if low < 0 or (vocab is not None and high >= vocab):
        bad = low if low < 0 else high
        where = int(np.flatnonzero(tokens == bad)[0])
        accepted = "ids >= 0" if vocab is None else f"ids in [0, {vocab}) (the model's vocabulary)"
        return f"rollout {rid}: token {where} is id {bad}; accepted: {accepted}"
    bad_logprob = ~(np.isfinite(logprobs) & (logprobs <= 0))
    if bad_logprob.any():
        where = int(np.flatnonzero(bad_logprob)[0])
        return f"rollout {rid}: token {where} has log-prob {float(logprobs[where])!r}; a log-prob is finite and <= 0"
    turns = e.turns
    if bounds.episodes is not None and bool(turns) != bounds.episodes:
        return (f"rollout {rid}: a completion of a run with episodes.tools has turns" if bounds.episodes else
                f"rollout {rid}: a completion with turns in a run without episodes.tools")
    if turns or type(turns) is not tuple:
        from runtime.episodes.rollout import turns_problem

        problem = turns_problem(turns, n, bounds.max_tokens)
        if problem is not None:
            return f"rollout {rid}: {problem}"
    reason = e.finish_reason
    if reason not in (FINISH_STOP, FINISH_LENGTH):
        return f"rollout {rid}: finish reason {str(reason)[:40]!r}; accepted: 'stop', 'length'"
    m = bounds.max_tokens
    if m is not None:
        if n > m:
            return f"rollout {rid}: {n} tokens; sampling.max_tokens is {m}"
        if reason == FINISH_LENGTH and n != m:
            return (f"rollout {rid}: finish reason 'length' after {n} tokens; it is given at sampling.max_tokens "
                    f"({m}) only, 'stop' before")
    return None


def outcome_values(e: ev.OutcomeRecorded) -> str | None:
    """Why outcome ``e``'s reward is out of the task's range (:data:`REWARD_RANGE`), or None."""
    reward = e.reward
    low, high = REWARD_RANGE
    if not (isinstance(reward, float) and math.isfinite(reward) and abs(reward) <= _FLOAT32_MAX):
        return f"rollout {e.rollout_id}: reward {reward!r} is not finite in float32"
    if not low <= reward <= high:
        return f"rollout {e.rollout_id}: reward {reward!r} is outside the tasks' range [{low}, {high}]"
    if e.passed and reward != high:
        return f"rollout {e.rollout_id}: a passed outcome earns reward {high}, not {reward!r}"
    return None

