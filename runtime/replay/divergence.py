"""Where a replay departs from the ledger: :class:`Divergence` and the bit-exact comparisons.

Every comparison is exact: digests as strings, metrics as the float64 values the ledger stores
(float32 results widened, so equal bits give equal values), log-probs by their float32 bit
patterns (``-0.0`` and ``0.0`` differ, a NaN equals itself only with the same payload).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from ledger import events as ev
from runtime.replay.plan import Published, SampledRollout, StepPlan

STAGES = ("ledger", "controller", "snapshot", "weights", "rollout", "params")


@dataclasses.dataclass(frozen=True)
class Divergence:
    """One place where the replay and the ledger disagree.

    Attributes:
      stage: ``ledger`` (hash chain), ``controller`` (a logged decision), ``snapshot`` (a stored
        controller snapshot that is not the fold at its seq), ``weights`` (a train
        step), ``rollout`` (a re-sampled completion) or ``params`` (the run's parameter store).
      seq: the ledger position of the event that disagrees.
      kind: that event's kind.
      field: the first field that differs (``metrics.<name>`` for a step metric).
      message: one line saying what was logged and what the replay got.
      version: the weight version concerned, if any.
      rollout_id: the rollout concerned, if any.
    """

    stage: str
    seq: int
    kind: str
    field: str
    message: str
    version: int | None = None
    rollout_id: int | None = None

    def __str__(self) -> str:
        where = [f"seq {self.seq} ({self.kind})"]
        if self.version is not None:
            where.append(f"version {self.version}")
        if self.rollout_id is not None:
            where.append(f"rollout {self.rollout_id}")
        return f"{', '.join(where)}: field {self.field!r}: {self.message}"

    def sort_key(self) -> tuple[int, int]:
        return self.seq, STAGES.index(self.stage)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 24 else text[:16] + "…"


def compare_version0(published: Published, digest: str) -> Divergence | None:
    """The rebuilt initial weights against the logged version 0."""
    if published.event.digest == digest:
        return None
    return Divergence("weights", published.seq, ev.WeightsPublished.KIND, "digest",
                      f"logged {_short(published.event.digest)}, rebuilt initial weights {_short(digest)} "
                      "(the warm start or model init differs)", version=0)


def compare_step(plan: StepPlan, trained: ev.TrainStepCompleted, published: ev.WeightsPublished) -> list[Divergence]:
    """A re-run step's events against the logged ones, in ledger order (empty: bit-exact)."""
    out = []
    field = plan.trained.first_difference(trained)
    if field is not None:
        logged, got = getattr(plan.trained, field), getattr(trained, field)
        if field == "metrics":
            field, logged, got = _metric_difference(logged, got)
        out.append(Divergence("weights", plan.trained_seq, ev.TrainStepCompleted.KIND, field,
                              f"logged {_short(logged)}, replayed {_short(got)}", version=plan.step))
    logged_pub = plan.published
    field = logged_pub.event.first_difference(published)
    if field is not None:
        out.append(Divergence("weights", logged_pub.seq, ev.WeightsPublished.KIND, field,
                              f"logged {_short(getattr(logged_pub.event, field))}, "
                              f"replayed {_short(getattr(published, field))}", version=plan.step))
    return out


def _metric_difference(logged: Mapping[str, float], got: Mapping[str, float]) -> tuple[str, Any, Any]:
    for name in sorted(set(logged) | set(got)):
        a, b = logged.get(name), got.get(name)
        same = a is not None and b is not None and np.float64(a).tobytes() == np.float64(b).tobytes()
        if not same:
            return f"metrics.{name}", a, b
    return "metrics", dict(logged), dict(got)


_ROLLOUT_FIELDS = ("policy_version", "weights_digest", "tokens", "logprobs", "finish_reason")


def _turns_difference(logged: tuple, regenerated: tuple) -> str | None:
    """Where a re-sampled episode's tool calls first differ from the logged ones (all but the wall
    time): a tool that gave another result for the same call is named as not deterministic."""
    for k, (a, b) in enumerate(zip(logged, regenerated, strict=False), 1):
        ca, cb = a["call"], b["call"]
        if ca is None or cb is None:
            if (ca is None) != (cb is None):
                return f"turn {k}: logged {'a final answer' if ca is None else 'a tool call'}, regenerated " \
                       f"{'a final answer' if cb is None else 'a tool call'}"
            continue
        if (ca["tool"], ca["arguments"]) != (cb["tool"], cb["arguments"]):
            return f"turn {k}: logged call {ca['tool']}({_short(ca['arguments'])}), regenerated {cb['tool']}({_short(cb['arguments'])})"
        fields = [f for f in ("output", "exit_status", "truncated", "status", "detail") if ca[f] != cb[f]]
        if fields:
            return (f"turn {k}: tool {ca['tool']!r} is not deterministic: the same call gave another "
                    f"{', '.join(fields)} than the record")
    if len(logged) != len(regenerated):
        return f"logged {len(logged)} turns, regenerated {len(regenerated)}"
    return None


def compare_rollout(sampled: SampledRollout, regenerated: ev.RolloutCompleted) -> Divergence | None:
    """A re-sampled completion against the logged one: a multi-turn episode's tool calls (each
    result equal to the record but for its wall time), tokens, log-prob bits, finish reason."""
    logged = sampled.completion
    if logged.turns or regenerated.turns:
        message = _turns_difference(tuple(logged.turns), tuple(regenerated.turns))
        if message is not None:
            return Divergence("rollout", sampled.seq, ev.RolloutCompleted.KIND, "turns", message,
                              version=sampled.lease.policy_version, rollout_id=sampled.lease.rollout_id)
    for field in _ROLLOUT_FIELDS:
        a, b = getattr(logged, field), getattr(regenerated, field)
        if field == "tokens":
            message = _array_difference(np.asarray(a, np.int32), np.asarray(b, np.int32), "token")
        elif field == "logprobs":
            message = _array_difference(logprob_bits(a), logprob_bits(b), "log-prob bits", show=lambda x: f"{x:#010x}")
        else:
            message = None if a == b else f"logged {_short(a)}, regenerated {_short(b)}"
        if message is not None:
            return Divergence("rollout", sampled.seq, ev.RolloutCompleted.KIND, field, message,
                              version=sampled.lease.policy_version, rollout_id=sampled.lease.rollout_id)
    return None


def first_difference_index(a: np.ndarray, b: np.ndarray) -> int | None:
    """The first position where flat arrays ``a`` and ``b`` differ (the shorter one's length when
    one is a prefix of the other), or None when they are equal."""
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    if diff.size:
        return int(diff[0])
    return None if a.size == b.size else n


def logprob_bits(x) -> np.ndarray:
    """Log-probs as their float32 bit patterns (``-0.0`` differs from ``0.0``, NaNs by payload)."""
    return np.asarray(x, np.float32).view(np.uint32)


def _array_difference(a: np.ndarray, b: np.ndarray, what: str, show=str) -> str | None:
    i = first_difference_index(a, b)
    if i is None:
        return None
    if i < min(a.size, b.size):
        return f"{what} {i} differs: logged {show(a[i])}, regenerated {show(b[i])}"
    return f"logged {a.size} values, regenerated {b.size}"


def _plain(value: Any) -> Any:
    """``value`` with every tuple a list: the ledger's codec reads a recorded list back as a tuple."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def fingerprint_diff(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The fingerprint keys whose values differ, with both values, by key (a recorded tuple equals
    the current list it was written from). The input files (``inputs``) are not the machine's: they
    are checked, and refused, by ``runtime.inputs.check``."""
    return {
        key: {"recorded": recorded.get(key), "current": current.get(key)}
        for key in sorted((set(recorded) | set(current)) - {"inputs"})
        if _plain(recorded.get(key)) != _plain(current.get(key))
    }
