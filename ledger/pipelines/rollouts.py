"""Apache Beam pipelines over a run's ledger: one row per rollout, statistics per weight version.

A ledger is a log; its questions are joins. "Which weights produced this sample, which samples
trained this version?" needs a rollout's request, leases, completion, outcome and the batch that
consumed it, which sit at different places of the log. These transforms do that join on a Beam
runner, so the same pipeline answers on a laptop (``DirectRunner``) and over many runs on Flink,
Spark or Dataflow:

- :class:`ReadLedger` reads a run in seq ranges, each range on its own store connection;
- :class:`RolloutRows` keys every fact about a rollout by its id, groups, and builds one row;
- :class:`VersionStats` aggregates the rows by the policy version that sampled them;
- :class:`StepRows` gives one row per train step: its batch, staleness, metrics and digests.

Rows are plain JSON-able dicts. The first record of a fact wins, as in the audit (an edited
ledger cannot replace a request or a completion by appending another one). Output order is the
runner's: every row carries its ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam

from ledger import events as ev
from ledger.backends import open_store
from ledger.errors import LedgerError, RunNotFound
from ledger.store import EventStore
from ledger.url import resolve_url, scheme

DEFAULT_RANGE = 20_000
"""Events per read range: the unit of parallelism of :class:`ReadLedger`."""


def _check_url(target: str) -> str:
    url = resolve_url(target)
    if scheme(url) in ("memory", ":memory:"):
        raise LedgerError(f"a pipeline reads the ledger from its own workers, which cannot see {url!r}; "
                          "give a SQLite file, a run directory or a PostgreSQL URL")
    return url


class _ReadRange(beam.DoFn):
    """``(first, last)`` seq ranges → ``(seq, event)``; one store connection per worker."""

    def __init__(self, url: str, run_id: str) -> None:
        self.url, self.run_id = url, run_id
        self.store: EventStore | None = None

    def setup(self) -> None:
        self.store = open_store(self.url, readonly=True)

    def process(self, bounds: tuple[int, int]) -> Iterator[tuple[int, ev.Event]]:
        first, last = bounds
        assert self.store is not None  # Beam calls setup before process
        for stored in self.store.read(self.run_id, first, last):
            yield stored.seq, stored.event

    def teardown(self) -> None:
        if self.store is not None:
            self.store.close()


class ReadLedger(beam.PTransform):
    """The events of run ``run_id`` in the ledger at ``target`` as ``(seq, event)`` elements.

    The run's head is read when the pipeline is built; events appended later are not read.
    ``target`` is a SQLite file, a run directory or a PostgreSQL URL (every worker opens it).
    """

    def __init__(self, target: str, run_id: str, range_events: int = DEFAULT_RANGE) -> None:
        super().__init__()
        if range_events < 1:
            raise LedgerError(f"events per read range (--range-events) must be >= 1, got {range_events}")
        self.url, self.run_id, self.range_events = _check_url(target), run_id, range_events
        with open_store(self.url, readonly=True) as store:
            if run_id not in store.runs():
                raise RunNotFound(run_id, store.runs())
            self.head = store.head(run_id).seq

    def expand(self, pbegin):
        n = self.range_events
        ranges = [(first, min(first + n - 1, self.head)) for first in range(1, self.head + 1, n)]
        return (pbegin
                | "Ranges" >> beam.Create(ranges)
                | "Spread" >> beam.Reshuffle()
                | "Read" >> beam.ParDo(_ReadRange(self.url, self.run_id)))


# -- rollout rows ------------------------------------------------------------------------------

DISCARDS, PUBLISHED = "discards", "published"


EXPORTED = frozenset({
    ev.RolloutRequested, ev.RolloutAssigned, ev.RolloutCompleted, ev.RolloutAbandoned, ev.OutcomeRecorded,
    ev.GroupDiscarded, ev.BatchFormed, ev.TrainStepCompleted, ev.WeightsPublished,
})
"""Event kinds whose facts reach the rows (``_facts``, ``_step_facts``)."""
NOT_EXPORTED: dict[type, str] = {
    ev.RunStarted: "the config and fingerprint belong to the run, not to a row (the export's caller reads them)",
    ev.RunForked: "the parent and the changed settings belong to the run, not to a row (the export's caller reads them)",
    ev.ControllerStarted: "writer epochs are infrastructure: no rollout, version or step fact",
    ev.SnapshotTaken: "a snapshot of the controller's fold is infrastructure: no rollout, version or step fact",
    ev.WorkerJoined: "a rollout row names its workers through its leases and completion",
    ev.WorkerLost: "a lost worker's leases appear as the rollout's later attempts",
    ev.PromptsSampled: "each request carries its prompt index",
    ev.VersionsRetired: "retention is the parameter store's life cycle, not a fact of a version's rollouts",
    ev.RunFinished: "the end of the run states no row's fact",
    ev.VersionEvaluated: "a held-out evaluation is a fact of a version, not of a rollout or a step's batch",
}
"""Event kinds no row reads, and why (every kind is one or the other)."""


def _turns(turns: tuple) -> list[dict] | None:
    """A multi-turn completion's turn records as JSON (a call's output bytes in hex); None for
    one completion."""
    if not turns:
        return None
    return [{**t, "call": None if t["call"] is None else
             {**{k: v for k, v in t["call"].items() if k != "output"}, "output_hex": t["call"]["output"].hex()}}
            for t in turns]


def _facts(item: tuple[int, ev.Event]) -> Iterator[Any]:
    """The facts an event states about rollouts: ``(rollout_id, (seq, tag, value))``; group
    discards and published digests go to their own outputs (they are joined as side inputs)."""
    seq, e = item
    if type(e) is ev.RolloutCompleted:
        yield e.rollout_id, (seq, "completed", {
            "worker": e.worker_id, "attempt": e.attempt, "weights_digest": e.weights_digest,
            "token_ids": e.tokens.tolist(), "logprobs": e.logprobs.tolist(), "finish_reason": e.finish_reason,
            "turns": _turns(e.turns)})
    elif type(e) is ev.OutcomeRecorded:
        yield e.rollout_id, (seq, "scored", {
            "reward": e.reward, "passed": e.passed, "verdict": e.verdict, "verifier": e.verifier,
            "verifier_version": e.verifier_version, "detail": e.detail})
    elif type(e) is ev.RolloutRequested:
        for q in e.samples():
            yield q.rollout_id, (seq, "requested", {
                "group_id": q.group_id, "batch": q.batch, "ordinal": q.ordinal, "prompt_index": q.prompt_index,
                "policy_version": q.policy_version, "seed": q.seed, "sampling": dict(q.sampling)})
    elif type(e) is ev.RolloutAssigned:
        for rid, attempt in zip(e.rollout_ids, e.attempts, strict=False):
            yield rid, (seq, "assigned", {"worker": e.worker_id, "attempt": attempt})
    elif type(e) is ev.RolloutAbandoned:
        yield e.rollout_id, (seq, "abandoned", {"attempt": e.attempt, "reason": e.reason})
    elif type(e) is ev.BatchFormed:
        for rid in e.rollout_ids:
            yield rid, (seq, "consumed", {"step": e.step})
    elif type(e) is ev.GroupDiscarded:
        yield beam.pvalue.TaggedOutput(DISCARDS, (e.group_id, (seq, e.reason)))
    elif type(e) is ev.WeightsPublished:
        yield beam.pvalue.TaggedOutput(PUBLISHED, (e.version, (seq, e.digest)))


def _row(run_id: str, rollout_id: int, facts: Iterable[tuple[int, str, dict]],
         discards: dict[int, tuple[int, str]], published: dict[int, tuple[int, str]]) -> Iterator[dict]:
    """One rollout's row from its facts (none if it was never requested)."""
    first: dict[str, tuple[int, dict]] = {}
    leases, abandoned = [], []
    for seq, tag, value in sorted(facts, key=lambda f: (f[0], f[1])):
        if tag == "assigned":
            leases.append(value["worker"])
        elif tag == "abandoned":
            abandoned.append(value["reason"])
        else:
            first.setdefault(tag, (seq, value))
    if "requested" not in first:
        return
    request_seq, q = first["requested"]
    row: dict[str, Any] = {"run_id": run_id, "rollout_id": rollout_id, **q, "requested_seq": request_seq,
                           "attempts": len(leases), "abandoned": abandoned}
    completed = first.get("completed")
    row.update(completed[1] if completed else {
        "worker": None, "attempt": None, "weights_digest": None, "token_ids": None, "logprobs": None,
        "finish_reason": None, "turns": None})
    row["completed_seq"] = completed[0] if completed else None
    row["tokens"] = None if completed is None else len(completed[1]["token_ids"])
    scored = first.get("scored")
    row.update(scored[1] if scored else {
        "reward": None, "passed": None, "verdict": None, "verifier": None, "verifier_version": None, "detail": None})
    step = first["consumed"][1]["step"] if "consumed" in first else None
    produced = published.get(step) if step is not None else None
    discard = discards.get(q["group_id"])
    row.update({
        "consumed_by_step": step,
        "staleness": None if step is None else (step - 1) - q["policy_version"],
        "produced_version": step if produced else None,
        "produced_digest": produced[1] if produced else None,
        "discarded": discard[1] if discard else None,
    })
    yield row


class RolloutRows(beam.PTransform):
    """``(seq, event)`` elements of one run → one row (a dict) per requested rollout.

    A row holds the request (group, batch, ordinal, prompt index, seed, sampling, policy
    version), the leases (``attempts`` and ``abandoned`` reasons), the accepted completion
    (worker, weights digest, ``token_ids``, ``logprobs``, ``tokens`` count, finish reason), the
    verifier's outcome, the step that consumed it with its staleness, and the version that step
    produced with its digest, or the reason its group was discarded.
    """

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id

    def expand(self, events):
        facts = events | "Facts" >> beam.FlatMap(_facts).with_outputs(DISCARDS, PUBLISHED, main="rollouts")
        discards = facts[DISCARDS] | "FirstDiscard" >> beam.CombinePerKey(min)
        published = facts[PUBLISHED] | "FirstPublish" >> beam.CombinePerKey(min)
        return (facts.rollouts
                | "ByRollout" >> beam.GroupByKey()
                | "Row" >> beam.FlatMap(lambda kv, d, p: _row(self.run_id, kv[0], kv[1], d, p),
                                        beam.pvalue.AsDict(discards), beam.pvalue.AsDict(published)))


# -- steps ------------------------------------------------------------------------------------


def _step_facts(item: tuple[int, ev.Event]) -> Iterator[tuple[int, tuple[int, str, Any]]]:
    """Facts about train steps, keyed by step: ``(step, (seq, tag, value))``."""
    seq, e = item
    if type(e) is ev.BatchFormed:
        yield e.step, (seq, "batch", e)
    elif type(e) is ev.TrainStepCompleted:
        yield e.step, (seq, "trained", e.metrics)
    elif type(e) is ev.WeightsPublished:
        yield e.version, (seq, "produced", e.digest)
        yield e.version + 1, (seq, "parent", e.digest)  # step s reads version s - 1


def _step_row(run_id: str, step: int, facts: Iterable[tuple[int, str, Any]]) -> Iterator[dict]:
    first: dict[str, tuple[int, Any]] = {}
    for seq, tag, value in sorted(facts, key=lambda f: (f[0], f[1])):
        first.setdefault(tag, (seq, value))
    if "batch" not in first:
        return
    seq, b = first["batch"]
    staleness = [(step - 1) - int(v) for v in b.policy_versions]
    trained, produced, parent = first.get("trained"), first.get("produced"), first.get("parent")
    yield {
        "run_id": run_id, "step": step, "batch_seq": seq, "groups": len(b.group_ids), "rollouts": len(b.rollout_ids),
        "policy_versions": sorted(set(int(v) for v in b.policy_versions)),
        "staleness_max": max(staleness) if staleness else None,
        "staleness_mean": sum(staleness) / len(staleness) if staleness else None,
        "parent_digest": parent[1] if parent else None,
        "trained_seq": trained[0] if trained else None,
        "metrics": dict(trained[1]) if trained else None,
        "produced_digest": produced[1] if produced else None,
    }


class StepRows(beam.PTransform):
    """``(seq, event)`` elements of one run → one row per formed batch: its groups, rollouts,
    policy versions and staleness, the parent version's digest, the step's metrics and the
    digest of the version it produced (None for a step not trained yet)."""

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id

    def expand(self, events):
        return (events
                | "StepFacts" >> beam.FlatMap(_step_facts)
                | "ByStep" >> beam.GroupByKey()
                | "StepRow" >> beam.FlatMap(lambda kv: _step_row(self.run_id, kv[0], kv[1])))


# -- version statistics ------------------------------------------------------------------------


class _VersionTotals(beam.CombineFn):
    """Counts and sums over the rows sampled from one version (merged in any order)."""

    FIELDS = ("rollouts", "completed", "scored", "passed", "reward_sum", "token_sum", "consumed", "discarded")

    def create_accumulator(self) -> list:
        return [0, 0, 0, 0, 0.0, 0, 0, 0]

    def add_input(self, acc: list, row: dict) -> list:
        acc[0] += 1
        if row["tokens"] is not None:
            acc[1] += 1
            acc[5] += row["tokens"]
        if row["reward"] is not None:
            acc[2] += 1
            acc[3] += bool(row["passed"])
            acc[4] += row["reward"]
        acc[6] += row["consumed_by_step"] is not None
        acc[7] += row["discarded"] is not None
        return acc

    def merge_accumulators(self, accs: Iterable[list]) -> list:
        out = self.create_accumulator()
        for acc in accs:
            out = [a + b for a, b in zip(out, acc, strict=False)]
        return out

    def extract_output(self, acc: list) -> dict:
        return dict(zip(self.FIELDS, acc, strict=False))


def _version_row(run_id: str, version: int, totals: dict, published: dict[int, tuple[int, str]]) -> dict:
    t = totals
    return {
        "run_id": run_id, "version": version,
        "digest": published[version][1] if version in published else None,
        "rollouts": t["rollouts"], "completed": t["completed"], "scored": t["scored"], "passed": t["passed"],
        "pass_rate": t["passed"] / t["scored"] if t["scored"] else None,
        "mean_reward": t["reward_sum"] / t["scored"] if t["scored"] else None,
        "mean_tokens": t["token_sum"] / t["completed"] if t["completed"] else None,
        "consumed": t["consumed"], "discarded": t["discarded"],
    }


class VersionStats(beam.PTransform):
    """Rollout rows → one row per policy version that sampled rollouts: how many were sampled,
    completed, scored, passed, consumed by a step or discarded; pass rate, mean reward and mean
    length. ``digest`` comes from the row's own ``weights_digest`` values (None if no rollout
    of the version completed)."""

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id

    def expand(self, rows):
        digests = (rows
                   | "Digests" >> beam.FlatMap(lambda r: [(r["policy_version"], (r["completed_seq"], r["weights_digest"]))]
                                               if r["weights_digest"] else [])
                   | "FirstDigest" >> beam.CombinePerKey(min))
        return (rows
                | "ByVersion" >> beam.Map(lambda r: (r["policy_version"], r))
                | "Totals" >> beam.CombinePerKey(_VersionTotals())
                | "VersionRow" >> beam.Map(lambda kv, p: _version_row(self.run_id, kv[0], kv[1], p),
                                           beam.pvalue.AsDict(digests)))
