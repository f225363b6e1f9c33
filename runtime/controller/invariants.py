"""The invariants I1–I8 (``NAMES``), and the value ranges of I9, checked over a ledger's events.

Pure: ``check(events)`` takes the events of one run (plain, numbered from 1, or stored with
their seqs) and returns every violation found, each naming the invariant, the seq and what is
wrong. It trusts nothing the controller wrote: it recomputes staleness, group membership,
seeds and the version chain from the events themselves, so a hand-edited ledger (a rollout
consumed twice, a completion duplicated, a batch beyond the staleness bound) is caught even
where the edit keeps the hash chain valid. ``rlx audit check`` and the property tests use it.

I6 is checked by replaying the ledger with decision checking (``replay``); I8's second half
(each digest matches the stored weights) needs the parameter store, passed as ``digest_of``. I9
holds the recorded values to what the run could have produced (the rules the host's admission
applies, ``runtime.controller.admit.completion_values`` and ``outcome_values``), so a ledger
poisoned before admission checked them (an id outside the vocabulary, a NaN log-prob, a reward
out of range) is named; its vocabulary half needs the model's vocabulary size, passed as
``vocab_size``.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from ledger import events as ev
from ledger.store import StoredEvent
from runtime import rng
from runtime.controller.admit import Bounds, completion_values, outcome_values
from runtime.controller.replay import ReplayDivergence, replay
from runtime.controller.spec import DETERMINISTIC, ControllerSpec, SpecError

NAMES = {
    "I1": "staleness <= k for every consumed rollout",
    "I2": "each completed rollout consumed at most once",
    "I3": "a group enters one batch whole, from one policy version",
    "I4": "exactly one accepted completion per request",
    "I5": "no needed parameter version is retired",
    "I6": "folding the log reproduces the logged decisions",
    "I7": "deterministic mode: batch content is a function of seed, data and weights",
    "I8": "versions form a chain and match the stored weights",
    "I9": "recorded values are in range: token ids in the vocabulary, at most sampling.max_tokens of them "
          "with a consistent finish reason, finite log-probs <= 0, rewards in [0, 1]",
}


@dataclasses.dataclass(frozen=True)
class Violation:
    """One broken invariant at one event."""

    invariant: str
    seq: int
    message: str

    def __str__(self) -> str:
        return f"{self.invariant} at seq {self.seq}: {self.message}"


class _Checker:
    def __init__(self, digest_of: Callable[[int], str | None] | None, vocab_size: int | None = None):
        self.digest_of = digest_of
        self.vocab_size = vocab_size
        self.bounds = Bounds(vocab_size)
        self.unpublished: tuple[int, int] | None = None  # (step, seq) of a step whose weights are not yet published
        self.out: list[Violation] = []
        self.spec: ControllerSpec | None = None
        self.requests: dict[int, ev.SampleRequest] = {}
        self.groups: dict[int, list[int]] = defaultdict(list)
        self.leases: dict[int, int] = defaultdict(int)
        self.completed: dict[int, ev.RolloutCompleted] = {}
        self.scored: set[int] = set()
        self.discarded: set[int] = set()
        self.consumed: dict[int, int] = {}
        self.group_step: dict[int, int] = {}
        self.versions: dict[int, str] = {}  # published and retained
        self.digests: dict[int, str] = {}  # every published version
        self.retired: set[int] = set()
        self.latest = -1
        self.trained = 0
        self.requested_batch = 0
        self.open_batches: dict[int, int] = {}  # deterministic: unformed batch -> version
        self.incomplete: dict[int, int] = defaultdict(int)  # version -> live incomplete requests
        self.evaluated: dict[int, int] = {}  # version -> seq of its VersionEvaluated

    def flag(self, inv: str, seq: int, msg: str) -> None:
        self.out.append(Violation(inv, seq, msg))

    def _settle(self, rid: int) -> None:
        """A request stops being outstanding (completed, discarded or consumed)."""
        q = self.requests[rid]
        if rid not in self.completed:
            self.incomplete[q.policy_version] -= 1

    def run(self, seq: int, e: ev.Event) -> None:
        check = _CHECKS.get(type(e))
        if check is not None:
            check(self, seq, e)

    def _started(self, seq: int, e: ev.RunStarted) -> None:
        try:
            self.spec = ControllerSpec.from_config(e.config, e.seed)
        except SpecError as err:
            self.flag("I6", seq, f"RunStarted config unusable: {err}")
            return
        max_tokens = self.spec.sampling.get("max_tokens")
        tools = (e.config.get("episodes") or {}).get("tools") if isinstance(e.config, dict) else None
        self.bounds = Bounds(self.vocab_size, max_tokens if isinstance(max_tokens, int) else None, bool(tools))

    def _forked(self, seq: int, e: ev.RunForked) -> None:
        seed = 0 if self.spec is None else self.spec.seed
        try:
            self.spec = ControllerSpec.from_config(e.config, seed)
        except SpecError as err:
            self.flag("I6", seq, f"RunForked config unusable: {err}")

    def _assigned(self, seq: int, e: ev.RolloutAssigned) -> None:
        for rid in e.rollout_ids:
            q = self.requests.get(rid)
            if q is not None and q.policy_version in self.retired:
                self.flag("I5", seq, f"rollout {rid} leased after its version {q.policy_version} was retired")
            self.leases[rid] += 1

    def _outcome(self, seq: int, e: ev.OutcomeRecorded) -> None:
        problem = outcome_values(e)
        if problem is not None:
            self.flag("I9", seq, problem)
        if e.rollout_id not in self.completed:
            self.flag("I4", seq, f"outcome for rollout {e.rollout_id}, which has no accepted completion")
        elif e.rollout_id in self.scored:
            self.flag("I4", seq, f"second outcome for rollout {e.rollout_id}")
        self.scored.add(e.rollout_id)

    def _discarded(self, seq: int, e: ev.GroupDiscarded) -> None:
        if e.group_id in self.group_step:
            self.flag("I3", seq, f"group {e.group_id} discarded after entering batch {self.group_step[e.group_id]}")
        elif e.group_id not in self.discarded:
            for rid in self.groups.get(e.group_id, ()):
                self._settle(rid)
        self.discarded.add(e.group_id)

    def _trained(self, seq: int, e: ev.TrainStepCompleted) -> None:
        if e.step != self.trained + 1:
            self.flag("I8", seq, f"step {e.step} completed after step {self.trained}")
        self._lone_step()
        self.trained = e.step
        self.unpublished = (e.step, seq)

    def _lone_step(self) -> None:
        """Flag a step completed without its ``WeightsPublished`` right after it: a run whose
        ledger holds one cannot hand out another step."""
        if self.unpublished is not None:
            step, seq = self.unpublished
            self.flag("I8", seq, f"step {step} completed without its WeightsPublished {step} beside it; "
                                 "no later step can be handed out")
            self.unpublished = None

    def _requested(self, seq: int, e: ev.RolloutRequested) -> None:
        for q in e.samples():
            if q.rollout_id in self.requests:
                self.flag("I4", seq, f"rollout {q.rollout_id} requested twice")
                continue
            if q.policy_version in self.retired:
                self.flag("I5", seq, f"rollout {q.rollout_id} requested from retired version {q.policy_version}")
            self.requests[q.rollout_id] = q
            self.groups[q.group_id].append(q.rollout_id)
            self.incomplete[q.policy_version] += 1
        if self.spec is not None and self.spec.mode == DETERMINISTIC:
            self.requested_batch = max(self.requested_batch, e.batch)
            self.open_batches.setdefault(e.batch, e.policy_version)

    def _completed(self, seq: int, e: ev.RolloutCompleted) -> None:
        problem = completion_values(e, self.bounds)
        if problem is not None:
            self.flag("I9", seq, problem)
        rid = e.rollout_id
        q = self.requests.get(rid)
        if q is None:
            self.flag("I4", seq, f"completion of rollout {rid}, which was never requested")
            return
        if q.group_id in self.discarded or rid in self.consumed:
            self.flag("I4", seq, f"late completion of rollout {rid}: its group is discarded or consumed")
            return
        if rid in self.completed:
            self.flag("I4", seq, f"second completion of rollout {rid} (first by {self.completed[rid].worker_id})")
            return
        if not 0 <= e.attempt < self.leases[rid]:
            self.flag("I4", seq, f"completion of rollout {rid} attempt {e.attempt}, never leased ({self.leases[rid]} leases)")
        if e.policy_version != q.policy_version:
            self.flag("I4", seq, f"rollout {rid} requested from version {q.policy_version}, completed by {e.policy_version}")
        elif e.weights_digest != self.versions.get(q.policy_version):
            self.flag("I4", seq, f"rollout {rid} completed with weights {e.weights_digest[:16]}…, not version {q.policy_version}'s")
        self.completed[rid] = e
        self.incomplete[q.policy_version] -= 1

    def _batch(self, seq: int, e: ev.BatchFormed) -> None:
        s, spec = e.step, self.spec
        in_batch = set(e.rollout_ids)
        if len(in_batch) != len(e.rollout_ids):
            self.flag("I2", seq, f"batch {s} lists a rollout twice")
        if len(e.policy_versions) != len(e.rollout_ids):
            self.flag("I1", seq, f"batch {s} lists {len(e.policy_versions)} versions for {len(e.rollout_ids)} rollouts")
        for i, rid in enumerate(e.rollout_ids):
            q = self.requests.get(rid)
            if q is None:
                self.flag("I2", seq, f"batch {s} consumes rollout {rid}, which was never requested")
                continue
            if rid in self.consumed:
                self.flag("I2", seq, f"batch {s} consumes rollout {rid} again (first by batch {self.consumed[rid]})")
            elif rid not in self.completed or rid not in self.scored:
                self.flag("I2", seq, f"batch {s} consumes rollout {rid} before its completion and outcome")
            if i < len(e.policy_versions) and e.policy_versions[i] != q.policy_version:
                self.flag("I1", seq, f"batch {s} lists version {e.policy_versions[i]} for rollout {rid}, requested from {q.policy_version}")
            if spec is not None and (s - 1) - q.policy_version > spec.max_staleness:
                self.flag("I1", seq, f"rollout {rid} of version {q.policy_version} used in step {s}: staleness "
                                     f"{(s - 1) - q.policy_version} > {spec.max_staleness}")
            if q.group_id not in e.group_ids:
                self.flag("I3", seq, f"batch {s} takes rollout {rid} without naming its group {q.group_id}")
            if rid not in self.consumed:
                self._settle(rid)
            self.consumed.setdefault(rid, s)
        for gid in e.group_ids:
            members = self.groups.get(gid, [])
            if gid in self.discarded:
                self.flag("I3", seq, f"batch {s} takes discarded group {gid}")
            if gid in self.group_step:
                self.flag("I3", seq, f"batch {s} takes group {gid} again (first in batch {self.group_step[gid]})")
            self.group_step.setdefault(gid, s)
            missing = [r for r in members if r not in in_batch]
            if missing or not members:
                self.flag("I3", seq, f"batch {s} takes group {gid} without its rollouts {missing or 'all'}")
            if len({self.requests[r].policy_version for r in members}) > 1:
                self.flag("I3", seq, f"group {gid} mixes policy versions")
        if spec is not None and spec.mode == DETERMINISTIC:
            self._deterministic(seq, e, spec)
            self.open_batches.pop(s, None)

    def _deterministic(self, seq: int, e: ev.BatchFormed, spec: ControllerSpec) -> None:
        s = e.step
        version = spec.batch_version(s)
        ordinals = []
        for gid in e.group_ids:
            members = self.groups.get(gid, [])
            for sample, rid in enumerate(members):
                q = self.requests[rid]
                if q.batch != s or q.policy_version != version:
                    self.flag("I7", seq, f"batch {s} takes rollout {rid} requested for batch {q.batch} from "
                                         f"version {q.policy_version}; it must come from version {version}")
                if q.seed != rng.rollout_seed(spec.seed, s, q.ordinal, sample):
                    self.flag("I7", seq, f"rollout {rid} has seed {q.seed}, not the one of (batch {s}, "
                                         f"group {q.ordinal}, sample {sample})")
            if members:
                q = self.requests[members[0]]
                ordinals.append(q.ordinal)
                G = spec.groups_per_batch
                want = (rng.stream_prompt(spec.seed, spec.dataset_size, (s - 1) * G + q.ordinal)[1]
                        if q.ordinal < G else rng.resample_prompt(spec.seed, spec.dataset_size, s, q.ordinal))
                if q.prompt_index != want:
                    self.flag("I7", seq, f"group {gid} of batch {s} has prompt {q.prompt_index}, not {want}")
        if ordinals != sorted(ordinals):
            self.flag("I7", seq, f"batch {s} is not in group-ordinal order: {ordinals}")

    def _published(self, seq: int, e: ev.WeightsPublished) -> None:
        v = e.version
        if v != self.latest + 1:
            self.flag("I8", seq, f"version {v} published after version {self.latest}")
        if v > 0:
            if self.unpublished == (v, seq - 1):
                self.unpublished = None
            else:
                self._lone_step()
            if e.parent_version != v - 1 or e.parent_digest != self.digests.get(v - 1):
                self.flag("I8", seq, f"version {v} names parent {e.parent_version} {e.parent_digest[:16]}…, "
                                     f"not version {v - 1}")
            if self.trained != v:
                self.flag("I8", seq, f"version {v} published without train step {v}")
        if self.digest_of is not None:
            stored = self.digest_of(v)
            if stored is not None and stored != e.digest:
                self.flag("I8", seq, f"version {v}: stored weights have digest {stored[:16]}…, the ledger says {e.digest[:16]}…")
        self.versions[v] = e.digest
        self.digests[v] = e.digest
        self.latest = max(self.latest, v)

    def _evaluated(self, seq: int, e: ev.VersionEvaluated) -> None:
        v = e.version
        if v not in self.digests:
            self.flag("I8", seq, f"evaluation of version {v}, which is not published")
        elif e.digest != self.digests[v]:
            self.flag("I8", seq, f"evaluation of version {v} names weights {e.digest[:16]}…, not the published "
                                 f"{self.digests[v][:16]}…")
        if v in self.evaluated:
            self.flag("I8", seq, f"second evaluation of version {v} (first at seq {self.evaluated[v]})")
        self.evaluated.setdefault(v, seq)

    def _retired(self, seq: int, e: ev.VersionsRetired) -> None:
        spec = self.spec
        for v in e.versions:
            if v not in self.versions:
                self.flag("I5", seq, f"retires version {v}, which is not a retained published version")
                continue
            if v == self.latest:
                self.flag("I5", seq, f"retires the newest version {v}, which a resume needs")
            if spec is not None and spec.kept(v):
                self.flag("I5", seq, f"retires version {v}, which params.keep_every {spec.keep_every} keeps "
                                     "for replays to start from")
            if self.incomplete.get(v, 0) > 0:
                self.flag("I5", seq, f"retires version {v} while {self.incomplete[v]} requests from it are outstanding")
            if spec is not None and spec.mode == DETERMINISTIC:
                if v in self.open_batches.values():
                    self.flag("I5", seq, f"retires version {v}, which an unformed batch samples from")
                if self.requested_batch < spec.steps and v >= spec.batch_version(self.requested_batch + 1):
                    self.flag("I5", seq, f"retires version {v}, which batch {self.requested_batch + 1} will sample from")
            del self.versions[v]
            self.retired.add(v)


_CHECKS: dict[type, Callable[[_Checker, int, Any], None]] = {
    ev.RunStarted: _Checker._started,
    ev.RunForked: _Checker._forked,
    ev.RolloutRequested: _Checker._requested,
    ev.RolloutAssigned: _Checker._assigned,
    ev.RolloutCompleted: _Checker._completed,
    ev.OutcomeRecorded: _Checker._outcome,
    ev.GroupDiscarded: _Checker._discarded,
    ev.BatchFormed: _Checker._batch,
    ev.TrainStepCompleted: _Checker._trained,
    ev.WeightsPublished: _Checker._published,
    ev.VersionsRetired: _Checker._retired,
    ev.VersionEvaluated: _Checker._evaluated,
}

NOT_AUDITED: dict[type, str] = {
    ev.ControllerStarted: "epochs are the store's fencing; replay (I6) re-folds them",
    ev.SnapshotTaken: "it changes no state; `rlx ledger verify` proves the snapshot it commits to",
    ev.WorkerJoined: "worker registration constrains leases only, which replay (I6) re-checks",
    ev.WorkerLost: "a lost worker's leases go back; replay (I6) re-checks the fold",
    ev.PromptsSampled: "the prompt stream is re-derived and compared by replay (I6)",
    ev.RolloutAbandoned: "an abandoned lease changes no invariant; the next attempt is checked (I4)",
    ev.RunFinished: "the end of the run states no fact the invariants read",
}
"""Event kinds the invariant checks read nothing from, and why (every kind is one or the other)."""
AUDITED = frozenset(_CHECKS)


def check(events: Iterable[ev.Event | StoredEvent], *, digest_of: Callable[[int], str | None] | None = None,
          decisions: bool = True, vocab_size: int | None = None) -> list[Violation]:
    """Every violation of I1–I9 in a run's events, in ledger order.

    Args:
        events: the run's events, plain (numbered from 1) or stored (with their seqs).
        digest_of: the parameter store's digest of a version, or None when it is not stored
            (evicted); enables the weights half of I8.
        decisions: also replay with decision checking (I6).
        vocab_size: the model's vocabulary size, which every token id must be below (I9); None:
            ids are only checked to be >= 0.
    """
    events = list(events)
    checker = _Checker(digest_of, vocab_size)
    for i, item in enumerate(events, start=1):
        if isinstance(item, StoredEvent):
            checker.run(item.seq, item.event)
        else:
            checker.run(i, item)
    checker._lone_step()
    out = checker.out
    if decisions:
        try:
            replay(events)
        except ReplayDivergence as err:
            out.append(Violation("I6", err.seq, str(err)))
    return out
