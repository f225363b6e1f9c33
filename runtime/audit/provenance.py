"""Provenance of a run, answered from its events alone: pure, no JAX, no I/O.

:class:`Provenance` indexes a run's stored events once; its queries return JSON-able documents:

- :meth:`Provenance.version` — the lineage of a weight version: its parent chain down to version
  0 (digests), the step that produced it, its training batch and, for every rollout of the
  batch, the prompt, seed, sampling parameters, policy version and staleness, the worker that
  generated it and the verifier's outcome (verifier name and version), plus the step's metrics
  and the version's held-out evaluation, if it had one;
- :meth:`Provenance.rollout` — the history of one rollout, requested → assigned (every attempt
  and worker) → completed → scored → consumed by a step → the version that step produced;
- :meth:`Provenance.step` — a step's batch and the version it produced.

Staleness is ``(s - 1) - v`` for a rollout sampled from version ``v`` and consumed by step ``s``
(the rules of ``runtime.controller.decide``). Prompt texts come from a ``prompt_text(index)`` callable
(the task's), since the ledger logs prompt indices only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from typing import Any

from ledger import events as ev
from ledger.store import StoredEvent
from runtime.errors import UsageError

PromptText = Callable[[int], str | None]


def _no_text(index: int) -> None:
    del index


def _range(keys: Iterable[int]) -> str:
    keys = sorted(keys)
    if not keys:
        return "none"
    if keys == list(range(keys[0], keys[-1] + 1)):
        return f"{keys[0]}..{keys[-1]}" if len(keys) > 1 else str(keys[0])
    return ", ".join(map(str, keys[:20])) + (" …" if len(keys) > 20 else "")


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Indexes of one run's events, by rollout, group, step and version (each entry ``(seq, event)``)."""

    run: ev.RunStarted | None
    requests: dict[int, tuple[int, ev.SampleRequest]]
    assigned: dict[int, tuple[tuple[int, str, int], ...]]  # rollout -> (seq, worker, attempt) per lease
    abandoned: dict[int, tuple[tuple[int, ev.RolloutAbandoned], ...]]
    completed: dict[int, tuple[int, ev.RolloutCompleted]]
    outcomes: dict[int, tuple[int, ev.OutcomeRecorded]]
    discarded: dict[int, tuple[int, ev.GroupDiscarded]]
    batches: dict[int, tuple[int, ev.BatchFormed]]
    trained: dict[int, tuple[int, ev.TrainStepCompleted]]
    published: dict[int, tuple[int, ev.WeightsPublished]]
    retired: dict[int, int]
    consumed: dict[int, int]
    evaluated: dict[int, tuple[int, ev.VersionEvaluated]] = dataclasses.field(default_factory=dict)
    requested_ids: frozenset[int] | None = None
    """Every requested rollout id, when ``requests`` holds only some of them (a query's index
    names them all for its error message)."""

    @classmethod
    def from_events(cls, events: Iterable[StoredEvent], *, rollouts: AbstractSet[int] | None = None) -> Provenance:
        """Index ``events`` (one run, seq order). Later duplicates never replace a first record.

        ``rollouts``: index the life of these rollouts only (None: all), as a query that needs a
        few of them does; everything about versions, steps and groups is indexed either way.
        """
        run = None
        keep = (lambda rid: True) if rollouts is None else rollouts.__contains__
        tables: dict[str, Any] = {name: {} for name in (
            "requests", "completed", "outcomes", "discarded", "batches", "trained", "published", "retired", "consumed",
            "evaluated")}
        assigned: dict[int, list] = {}
        abandoned: dict[int, list] = {}
        for stored in events:
            seq, e = stored.seq, stored.event
            if type(e) is ev.RunStarted:
                run = run or e
            elif type(e) is ev.RolloutRequested:
                if rollouts is None or not rollouts.isdisjoint(e.rollout_ids):
                    for q in e.samples():
                        if keep(q.rollout_id):
                            tables["requests"].setdefault(q.rollout_id, (seq, q))
            elif type(e) is ev.RolloutAssigned:
                for rid, attempt in zip(e.rollout_ids, e.attempts, strict=False):
                    if keep(rid):
                        assigned.setdefault(rid, []).append((seq, e.worker_id, attempt))
            elif type(e) is ev.RolloutAbandoned:
                if keep(e.rollout_id):
                    abandoned.setdefault(e.rollout_id, []).append((seq, e))
            elif type(e) is ev.RolloutCompleted:
                if keep(e.rollout_id):
                    tables["completed"].setdefault(e.rollout_id, (seq, e))
            elif type(e) is ev.OutcomeRecorded:
                if keep(e.rollout_id):
                    tables["outcomes"].setdefault(e.rollout_id, (seq, e))
            elif type(e) is ev.GroupDiscarded:
                tables["discarded"].setdefault(e.group_id, (seq, e))
            elif type(e) is ev.BatchFormed:
                tables["batches"].setdefault(e.step, (seq, e))
                for rid in e.rollout_ids:
                    if keep(rid):
                        tables["consumed"].setdefault(rid, e.step)
            elif type(e) is ev.TrainStepCompleted:
                tables["trained"].setdefault(e.step, (seq, e))
            elif type(e) is ev.WeightsPublished:
                tables["published"].setdefault(e.version, (seq, e))
            elif type(e) is ev.VersionsRetired:
                for v in e.versions:
                    tables["retired"].setdefault(int(v), seq)
            elif type(e) is ev.VersionEvaluated:
                tables["evaluated"].setdefault(e.version, (seq, e))
        return cls(run=run, assigned={k: tuple(v) for k, v in assigned.items()},
                   abandoned={k: tuple(v) for k, v in abandoned.items()}, **tables)

    # -- versions -------------------------------------------------------------------------------

    def version(self, v: int, *, prompt_text: PromptText = _no_text) -> dict[str, Any]:
        """The lineage of version ``v`` (see the module docstring)."""
        if v not in self.published:
            raise UsageError(f"version {v!r} is not in this run; published versions: {_range(self.published)}")
        seq, pub = self.published[v]
        chain: list[dict[str, Any]] = []
        u = v
        while u in self.published and len(chain) <= v:  # an edited ledger may hold a cycle
            chain.append({"version": u, "digest": self.published[u][1].digest, "seq": self.published[u][0]})
            u = self.published[u][1].parent_version
        doc: dict[str, Any] = {
            "version": v, "digest": pub.digest, "seq": seq, "retired_seq": self.retired.get(v),
            "parent_chain": chain, "origin": self._origin() if v == 0 else f"train step {v}",
            "step": None, "rollouts": [], "evaluation": self._evaluation(v),
        }
        if v > 0 and v in self.batches:
            doc["step"] = self.step(v)
            doc["rollouts"] = [self._rollout_row(rid, prompt_text) for rid in self.batches[v][1].rollout_ids]
        return doc

    def _evaluation(self, v: int) -> dict[str, Any] | None:
        """Version ``v``'s held-out evaluation, or None."""
        if v not in self.evaluated:
            return None
        seq, e = self.evaluated[v]
        return {"seq": seq, "digest": e.digest, "problems": e.problems, "greedy_pass_rate": e.greedy_pass_rate,
                "k": e.k, "samples": e.samples, "pass_at_k": e.pass_at_k, "sampled_pass_rate": e.sampled_pass_rate,
                "evaluator": e.evaluator}

    def _origin(self) -> str:
        config = self.run.config if self.run is not None else {}
        model = (config.get("model") or {}).get("path") or "built-in model"
        warm = (config.get("pretrain") or {}).get("steps", 0)
        seed = self.run.seed if self.run is not None else "?"
        return f"initial weights: {model}, seed {seed}, {warm} supervised warm-start steps"

    # -- steps ----------------------------------------------------------------------------------

    def step(self, s: int) -> dict[str, Any]:
        """Step ``s``: its batch, the version it read and the version it produced."""
        if s not in self.batches:
            raise UsageError(f"step {s!r} is not in this run; formed batches: {_range(self.batches)}")
        batch_seq, b = self.batches[s]
        staleness = [(s - 1) - int(v) for v in b.policy_versions]
        trained = self.trained.get(s)
        produced = self.published.get(s)
        parent = self.published.get(s - 1)
        return {
            "step": s,
            "batch_seq": batch_seq,
            "group_ids": list(b.group_ids),
            "rollout_ids": list(b.rollout_ids),
            "policy_versions": sorted({int(v) for v in b.policy_versions}),
            "staleness_max": max(staleness, default=0),
            "staleness_mean": sum(staleness) / len(staleness) if staleness else 0.0,
            "parent": None if parent is None else {"version": s - 1, "digest": parent[1].digest},
            "trained_seq": None if trained is None else trained[0],
            "batch_digest": None if trained is None else trained[1].batch_digest,
            "metrics": None if trained is None else dict(sorted(trained[1].metrics.items())),
            "produced": None if produced is None else {"version": s, "digest": produced[1].digest, "seq": produced[0]},
        }

    # -- rollouts -------------------------------------------------------------------------------

    def _rollout_row(self, rid: int, prompt_text: PromptText) -> dict[str, Any]:
        _, q = self.requests[rid]
        c = self.completed.get(rid)
        o = self.outcomes.get(rid)
        step = self.consumed.get(rid)
        return {
            "rollout_id": rid, "group_id": q.group_id, "batch": q.batch, "prompt_index": q.prompt_index,
            "prompt": prompt_text(q.prompt_index), "seed": q.seed, "sampling": dict(q.sampling),
            "policy_version": q.policy_version,
            "staleness": None if step is None else (step - 1) - q.policy_version,
            "attempts": len(self.assigned.get(rid, ())),
            "worker": None if c is None else c[1].worker_id,
            "tokens": None if c is None else len(c[1].tokens),
            "finish_reason": None if c is None else c[1].finish_reason,
            "reward": None if o is None else o[1].reward,
            "passed": None if o is None else o[1].passed,
            "verdict": None if o is None else o[1].verdict,
            "verifier": None if o is None else o[1].verifier,
            "verifier_version": None if o is None else o[1].verifier_version,
        }

    def rollout(self, rid: int, *, prompt_text: PromptText = _no_text) -> dict[str, Any]:
        """Rollout ``rid``: what it was, and every event of its life in ledger order."""
        if rid not in self.requests:
            known = self.requests if self.requested_ids is None else self.requested_ids
            if rid in known:
                raise UsageError(f"rollout {rid!r} was not read for this query")
            raise UsageError(f"rollout {rid!r} is not in this run; requested rollouts: {_range(known)}")
        seq, q = self.requests[rid]
        history = [(seq, "requested", (f"group {q.group_id} of batch {q.batch}, prompt {q.prompt_index}, "
                                       f"version {q.policy_version}, seed {q.seed}"))]
        history += [(s, "assigned", f"to {worker}, attempt {attempt}") for s, worker, attempt in self.assigned.get(rid, ())]
        history += [(s, "abandoned", f"attempt {a.attempt}: {a.reason}") for s, a in self.abandoned.get(rid, ())]
        if rid in self.completed:
            s, c = self.completed[rid]
            history.append((s, "completed", (f"by {c.worker_id}, attempt {c.attempt}, {len(c.tokens)} tokens, "
                                             f"{c.finish_reason}, weights {c.weights_digest[:16]}")))
        if rid in self.outcomes:
            s, o = self.outcomes[rid]
            history.append((s, "scored", (f"reward {o.reward}, {'passed' if o.passed else 'failed'} ({o.verdict}) "
                                          f"by {o.verifier} {o.verifier_version}")))
        if q.group_id in self.discarded:
            s, d = self.discarded[q.group_id]
            history.append((s, "discarded", f"group {q.group_id}: {d.reason}"))
        step = self.consumed.get(rid)
        produced = None
        if step is not None:
            history.append((self.batches[step][0], "consumed", f"by step {step}"))
            if step in self.trained:
                history.append((self.trained[step][0], "trained", f"step {step}"))
            if step in self.published:
                s, p = self.published[step]
                produced = {"version": step, "digest": p.digest, "seq": s}
                history.append((s, "published", f"version {step}, digest {p.digest[:16]}"))
        doc = self._rollout_row(rid, prompt_text)
        doc.update(
            consumed_by_step=step,
            produced_version=produced,
            discarded=None if q.group_id not in self.discarded else self.discarded[q.group_id][1].reason,
            history=[{"seq": s, "event": what, "detail": detail} for s, what, detail in sorted(history)],
        )
        return doc

    def retained(self) -> dict[int, int]:
        """Versions published and never retired, by the seq of their ``WeightsPublished``."""
        return {v: seq for v, (seq, _) in sorted(self.published.items()) if v not in self.retired}
