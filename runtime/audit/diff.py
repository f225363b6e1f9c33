"""Where two runs part: ``rlx audit DIR diff OTHER``.

Two runs of the same config, seed, data and software stack have the same weight digests, batch
for batch (deterministic mode, invariant I7 of ``runtime.controller.invariants``). When they do not, the question is where they
first part and why. :func:`diff_runs` answers from the two ledgers alone:

- where one is a fork of the other (``rlx fork``, ``runtime.fork``), or both of one parent: the
  fork point, the last seq their hash chains share, with the version published there and the
  settings the fork changed (the history before it is one history, so nothing before it is
  compared); else the logged config, key by key; the environment fingerprint, key by key;
- the first weight version whose digest differs, and for the step that produced it, whether
  its inputs (parent version, batch, the batch's rollouts) were the same;
- the first rollout (by id) whose request, completion or outcome differs, and whether the
  weights it was sampled from were identical (then the sampler, not training, parted).

Comparisons are exact: digests as strings, token ids and log-probs by their bytes, rewards as
the float64 values the ledger stores. Events of the infrastructure (workers, leases, epochs) are
timing and are not compared.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ledger import events as ev
from ledger.store import StoredEvent
from runtime.replay.divergence import first_difference_index, logprob_bits


class _Run:
    """The comparable facts of one run, by version, step and rollout."""

    def __init__(self, events: Iterable[StoredEvent]) -> None:
        self.started: ev.RunStarted | None = None
        self.fingerprint: dict = {}
        self.digests: dict[int, str] = {}
        self.batches: dict[int, ev.BatchFormed] = {}
        self.metrics: dict[int, dict] = {}
        self.requests: dict[int, ev.SampleRequest] = {}
        self.completions: dict[int, ev.RolloutCompleted] = {}
        self.outcomes: dict[int, ev.OutcomeRecorded] = {}
        self.chain: list[bytes] = []  # the chain digest at each seq, from seq 1
        self.forks: dict[int, ev.RunForked] = {}  # by seq
        for stored in events:
            e = stored.event
            self.chain.append(stored.digest)
            if type(e) is ev.RolloutRequested:
                for q in e.samples():
                    self.requests.setdefault(q.rollout_id, q)
            elif type(e) is ev.RolloutCompleted:
                self.completions.setdefault(e.rollout_id, e)
            elif type(e) is ev.OutcomeRecorded:
                self.outcomes.setdefault(e.rollout_id, e)
            elif type(e) is ev.WeightsPublished:
                self.digests.setdefault(e.version, e.digest)
            elif type(e) is ev.BatchFormed:
                self.batches.setdefault(e.step, e)
            elif type(e) is ev.TrainStepCompleted:
                self.metrics.setdefault(e.step, e.metrics)
            elif type(e) is ev.RunStarted and self.started is None:
                self.started = e
                self.fingerprint = dict(e.fingerprint)
            elif type(e) is ev.RunForked:
                self.forks[stored.seq] = e

    @property
    def config(self) -> dict:
        """The config the run ended with: its newest fork's, else the one it started with."""
        if self.forks:
            return self.forks[max(self.forks)].config
        return self.started.config if self.started else {}


def _fork_point(a: _Run, b: _Run) -> dict | None:
    """Where two runs that share the start of one hash chain part: the last shared seq, the
    ``RunForked`` that follows it in either, and what it changed; None when they share no event or
    neither forked there."""
    shared = 0
    for x, y in zip(a.chain, b.chain, strict=False):
        if x != y:
            break
        shared += 1
    sides = [(side, run.forks[shared + 1]) for side, run in (("a", a), ("b", b)) if shared + 1 in run.forks]
    if not shared or not sides:
        return None
    first = sides[0][1]
    return {"seq": shared, "version": first.version, "parent_digest": first.parent_digest,
            "forked": [side for side, _ in sides],
            "changes": {side: fork.changes for side, fork in sides},
            "reason": {side: fork.reason for side, fork in sides}}


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k in sorted(d):
        out.update(_flat(d[k], f"{prefix}.{k}" if prefix else str(k)))
    return out


def _differences(a: dict, b: dict) -> dict[str, list]:
    fa, fb = _flat(a), _flat(b)
    return {k: [fa.get(k), fb.get(k)] for k in sorted(fa.keys() | fb.keys()) if fa.get(k) != fb.get(k)}


def _rollout_difference(a: _Run, b: _Run, rid: int) -> dict | None:
    """What differs between the two runs' rollout ``rid`` (None if nothing). Only what both
    runs recorded is compared: a run that stopped earlier has fewer completions, not others."""
    qa, qb = a.requests.get(rid), b.requests.get(rid)
    if qa is not None and qb is not None:
        for name in ("group_id", "prompt_index", "seed", "policy_version", "sampling"):
            if getattr(qa, name) != getattr(qb, name):
                return {"rollout_id": rid, "field": name, "message": f"{name}: {getattr(qa, name)!r} vs {getattr(qb, name)!r}"}
    ca, cb = a.completions.get(rid), b.completions.get(rid)
    if ca is not None and cb is not None:
        at = first_difference_index(np.asarray(ca.tokens), np.asarray(cb.tokens))
        if at is not None:
            return {"rollout_id": rid, "field": "tokens", "position": at,
                    "message": f"tokens differ from position {at} ({len(ca.tokens)} vs {len(cb.tokens)} tokens)"}
        at = first_difference_index(logprob_bits(ca.logprobs), logprob_bits(cb.logprobs))
        if at is not None:
            la, lb = ca.logprobs.astype(np.float64), cb.logprobs.astype(np.float64)
            delta = float(np.max(np.abs(la - lb))) if la.shape == lb.shape else None
            return {"rollout_id": rid, "field": "logprobs", "position": at, "max_abs_delta": delta,
                    "message": f"same tokens, log-prob bits differ from position {at} (max |Δ| {delta})"}
    oa, ob = a.outcomes.get(rid), b.outcomes.get(rid)
    if oa is not None and ob is not None and (oa.reward, oa.passed, oa.verdict) != (ob.reward, ob.passed, ob.verdict):
        return {"rollout_id": rid, "field": "outcome",
                "message": f"reward {oa.reward} ({oa.verdict}) vs {ob.reward} ({ob.verdict})"}
    return None


def _step_inputs(a: _Run, b: _Run, step: int) -> dict:
    """Whether step ``step`` read the same parent version and the same batch in both runs."""
    ba, bb = a.batches.get(step), b.batches.get(step)
    parent = step - 1
    doc: dict[str, Any] = {"step": step, "parent_same": a.digests.get(parent) == b.digests.get(parent)}
    if ba is None or bb is None:
        doc.update(batch_same=False, message="the batch is missing in one run")
        return doc
    if (ba.rollout_ids, ba.policy_versions) != (bb.rollout_ids, bb.policy_versions):
        doc.update(batch_same=False, message="the batches hold other rollouts or versions")
        return doc
    differing = [d for d in (_rollout_difference(a, b, rid) for rid in ba.rollout_ids) if d is not None]
    doc.update(batch_same=not differing, rollouts_differing=len(differing),
               first_rollout=differing[0] if differing else None)
    if not doc["parent_same"]:
        doc["message"] = f"it started from a different version {parent}"
    elif differing:
        doc["message"] = f"{len(differing)} of its {len(ba.rollout_ids)} rollouts differ"
    else:
        doc["message"] = ("same parent weights and same batch, bit for bit: the train step itself gave other "
                          "bits (compare the fingerprints: software, CPU, core count)")
    metrics = _differences(a.metrics.get(step, {}), b.metrics.get(step, {}))
    doc["metrics_differing"] = sorted(metrics)
    return doc


def diff_runs(a_events: Iterable[StoredEvent], b_events: Iterable[StoredEvent]) -> dict[str, Any]:
    """Where run B first parts from run A (see the module docstring); JSON-able.

    ``fork_point`` (see :func:`_fork_point`) is None unless one run is a fork of the other (or
    both forks of one run); ``config_differences`` compare the configs the runs ended with.
    ``identical`` is True when every version published by both has the same digest and every
    rollout requested by both has the same request, and the same completion and outcome where
    both recorded one (a run that stopped earlier is identical to the longer one up to where it
    stopped; the ``only`` counts say how far each went).
    """
    a, b = _Run(a_events), _Run(b_events)
    config = _differences(a.config, b.config)
    fork = _fork_point(a, b)
    common = sorted(a.digests.keys() & b.digests.keys())
    first_version = next((v for v in common if a.digests[v] != b.digests[v]), None)
    version_doc = None
    if first_version is not None:
        version_doc = {"version": first_version, "digest_a": a.digests[first_version],
                       "digest_b": b.digests[first_version]}
        version_doc["cause"] = (_step_inputs(a, b, first_version) if first_version > 0 else
                                {"message": "the initial weights differ (model, seed or supervised warm start)"})
    rollout_doc = None
    for rid in sorted(a.requests.keys() & b.requests.keys()):
        d = _rollout_difference(a, b, rid)
        if d is not None:
            q = a.requests.get(rid) or b.requests.get(rid)
            assert q is not None  # rid is a request of both runs
            v = q.policy_version
            d["policy_version"] = v
            d["weights_same"] = v in a.digests and a.digests.get(v) == b.digests.get(v)
            rollout_doc = d
            break
    return {
        "identical": first_version is None and rollout_doc is None,  # over what both recorded
        "fork_point": fork,
        "config_differences": {k: v for k, v in config.items() if k != "run.name"},
        "fingerprint_differences": _differences(a.fingerprint, b.fingerprint),
        "versions_compared": len(common),
        "versions_identical": len(common) if first_version is None else common.index(first_version),
        "versions_only_a": len(a.digests.keys() - b.digests.keys()),
        "versions_only_b": len(b.digests.keys() - a.digests.keys()),
        "rollouts_compared": len(a.requests.keys() & b.requests.keys()),
        "rollouts_only_a": len(a.requests.keys() - b.requests.keys()),
        "rollouts_only_b": len(b.requests.keys() - a.requests.keys()),
        "first_divergent_version": version_doc,
        "first_divergent_rollout": rollout_doc,
    }
