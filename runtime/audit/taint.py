"""Taint: which outcomes, train steps and weight versions a verifier's mistake reached.

``rlx audit DIR taint --verifier NEW`` judges every recorded completion again with another scorer,
without generating anything: the run's task is rebuilt from its logged config (prompts and
answers by prompt index), each completion's token ids from ``RolloutCompleted`` are decoded
with the run's codec, and ``NEW`` scores them as a verifier worker would
(``runtime.workers.verifier.TaskVerifier``, one ``OutcomeRecorded`` each). ``NEW`` is

- ``FILE.py`` or ``FILE.py:FUNCTION``: a user's reward function, the same hook as
  ``verifier.reward``, run in the code sandbox;
- ``builtin``: the task's own verifier as the code here judges (the math verifier's rules, the
  code verifier), whatever scored the run: after a change of rules, the recorded version
  against the current one.

:func:`taint` (pure) compares the new judgements with the recorded ones. An outcome has
*changed* when its verdict or its reward differs. A train step is tainted when its batch holds a
changed outcome; a weight version is tainted when the step that produced it is, or when the
version it was trained from (its ``parent_version``) is, transitively. Rollouts sampled from a
tainted version are counted as well: their samples came from wrong weights, whatever their
verdicts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ledger import events as ev
from runtime.audit.provenance import Provenance
from runtime.errors import UsageError

BUILTIN = "builtin"
"""``--verifier`` value naming the task's own verifier as the code here judges."""
CHUNK = 512
"""Completions scored per call of the scorer (bounds the decoded texts held at once)."""
SHOWN = 12
"""Rows of the changed-outcome list the table shows without ``--all``."""

Log = Callable[[str], None]


def _judgement(o: ev.OutcomeRecorded) -> dict[str, Any]:
    return {"reward": o.reward, "passed": o.passed, "verdict": o.verdict, "verifier": o.verifier,
            "verifier_version": o.verifier_version}


def _versions(outcomes: Iterable[ev.OutcomeRecorded]) -> list[dict[str, Any]]:
    counts = Counter((o.verifier, o.verifier_version) for o in outcomes)
    return [{"verifier": name, "version": version, "outcomes": n} for (name, version), n in sorted(counts.items())]


def taint(prov: Provenance, rejudged: Mapping[int, ev.OutcomeRecorded]) -> dict[str, Any]:
    """What changes when the recorded outcomes of a run (``prov``, its events indexed) are replaced
    by ``rejudged`` (rollout id → the new scorer's record): a JSON-able document.

    Only rollouts with both a recorded and a new outcome are compared. Keys: ``rejudged`` (how
    many were compared), ``recorded_verifiers`` and ``new_verifiers`` (outcomes per verifier and
    version), ``changed`` (every changed outcome, by rollout id: the recorded and new judgement,
    the prompt, the version it was sampled from and the step that consumed it, if one did),
    ``reward_changed`` (how many of them changed reward), ``unconsumed_changed`` (changed but
    consumed by no step), ``steps`` (each tainted step, the changed rollouts it consumed and the
    version it produced), ``versions`` (each tainted version: trained on changed outcomes
    itself, trained from a tainted parent, or both; the rollouts sampled from it),
    ``first_tainted_version`` (None when none is), ``sampled_from_tainted`` (rollouts sampled
    from a tainted version).
    """
    changed: list[dict[str, Any]] = []
    compared: list[ev.OutcomeRecorded] = []
    by_step: dict[int, list[int]] = {}
    for rid in sorted(rejudged):
        if rid not in prov.outcomes or rid not in prov.requests:
            continue
        old, new = prov.outcomes[rid][1], rejudged[rid]
        compared.append(old)
        if old.verdict == new.verdict and old.reward == new.reward:
            continue
        q = prov.requests[rid][1]
        step = prov.consumed.get(rid)
        changed.append({"rollout_id": rid, "prompt_index": q.prompt_index, "policy_version": q.policy_version,
                        "consumed_by_step": step, "recorded": _judgement(old), "new": _judgement(new),
                        "reward_changed": old.reward != new.reward})
        if step is not None:
            by_step.setdefault(step, []).append(rid)
    steps = [{"step": s, "changed_rollouts": rids, "batch_rollouts": len(prov.batches[s][1].rollout_ids),
              "produced_version": s if s in prov.published else None} for s, rids in sorted(by_step.items())]
    sampled = Counter(q.policy_version for _, q in prov.requests.values())
    tainted: dict[int, dict[str, Any]] = {}
    for v, (_, pub) in sorted(prov.published.items()):  # a parent is published before its child
        direct, inherited = v in by_step, pub.parent_version in tainted and pub.parent_version != v
        if direct or inherited:
            tainted[v] = {"version": v, "digest": pub.digest, "parent_version": pub.parent_version,
                          "trained_on_changed": direct, "parent_tainted": inherited, "sampled_rollouts": sampled[v]}
    return {
        "rejudged": len(compared),
        "recorded_verifiers": _versions(compared),
        "new_verifiers": _versions(rejudged[o.rollout_id] for o in compared),
        "changed": changed,
        "reward_changed": sum(c["reward_changed"] for c in changed),
        "unconsumed_changed": sum(c["consumed_by_step"] is None for c in changed),
        "steps": steps,
        "versions": list(tainted.values()),
        "versions_published": len(prov.published),
        "first_tainted_version": min(tainted, default=None),
        "sampled_from_tainted": sum(sampled[v] for v in tainted),
    }


# -- the shell: the run's scorer rebuilt and every completion judged again -------------------


def scoring_config(config, verifier: str):
    """The run's ``config`` (a ``runtime.config.Config``) with its scoring replaced by
    ``verifier``: :data:`BUILTIN` or a reward file, ``FILE.py`` / ``FILE.py:FUNCTION`` (read and
    checked without running it; a bad one is a one-line ``UsageError`` naming it)."""
    import dataclasses

    if verifier == BUILTIN:
        return dataclasses.replace(config, verifier=dataclasses.replace(config.verifier, reward=None,
                                                                        reward_digest=None))
    from verifiers.errors import ConfigError
    from verifiers.reward import RewardModule, split_spec

    if not split_spec(verifier)[0].endswith(".py"):
        raise UsageError(f"--verifier {verifier!r}: give {BUILTIN!r} (the task's own verifier as judged here) or a "
                         "reward file, FILE.py (its function reward) or FILE.py:FUNCTION")
    try:
        RewardModule.load(verifier)  # read and checked here, so that a refusal names --verifier
    except ConfigError as e:
        raise UsageError(f"--verifier {verifier!r}: {str(e).removeprefix(f'verifier.reward {verifier!r}: ')}") from None
    return dataclasses.replace(config, verifier=dataclasses.replace(config.verifier, reward=verifier,
                                                                    reward_digest=None))


def rejudge(prov: Provenance, task, codec, *, log: Log = print) -> dict[int, ev.OutcomeRecorded]:
    """Every scored completion of a run (``prov``) judged by ``task`` (its ``score`` and
    ``reward``), decoded with ``codec``: rollout id → the new record, in rollout id order."""
    from runtime.controller.workers import ScoreTask
    from runtime.workers.verifier import TaskVerifier

    rids = sorted(rid for rid in prov.outcomes if rid in prov.completed and rid in prov.requests)
    scorer = TaskVerifier("taint", task, codec)
    out: dict[int, ev.OutcomeRecorded] = {}
    for start in range(0, len(rids), CHUNK):
        part = rids[start:start + CHUNK]
        items = [ScoreTask(rid, prov.requests[rid][1].prompt_index, prov.completed[rid][1]) for rid in part]
        out.update((o.rollout_id, o) for o in scorer.score(items))
        log(f"judged {start + len(part)} of {len(rids)} completions")
    return out


def taint_run(directory: str, run_id: str | None, verifier: str, *, log: Log = print) -> dict[str, Any]:
    """:func:`taint` of run ``run_id`` of ``directory`` judged again by ``verifier`` (see the
    module docstring), with the run's id and the scorer named."""
    from runtime.config import Config
    from runtime.replay import read_run
    from runtime.session import build_scoring

    source = read_run(directory, run_id)
    source.chain.raise_if_bad()
    started = next((s.event for s in source.events[:1] if isinstance(s.event, ev.RunStarted)), None)
    if started is None:
        raise UsageError(f"run {source.run_id!r} of {directory} has no RunStarted: its task cannot be rebuilt")
    task, codec = build_scoring(scoring_config(Config.from_dict(started.config), verifier), log=log)
    prov = Provenance.from_events(source.events)
    doc = taint(prov, rejudge(prov, task, codec, log=log))
    return {"run_id": source.run_id, "verifier": verifier, **doc}


def render(console, doc: dict[str, Any], *, shown: int | None = SHOWN) -> None:
    """``doc`` of :func:`taint_run` as tables; ``shown``: changed outcomes listed (None: all)."""
    from rich.table import Table

    def names(rows: list[dict[str, Any]]) -> str:
        return ", ".join(f"{r['verifier']} {r['version']} ({r['outcomes']})" for r in rows) or "-"

    console.print(f"run {doc['run_id']}: {doc['rejudged']} outcomes judged again by {doc['verifier']}")
    console.print(f"  recorded: {names(doc['recorded_verifiers'])}")
    console.print(f"  new:      {names(doc['new_verifiers'])}")
    changed = doc["changed"]
    console.print(f"{len(changed)} outcomes changed ({doc['reward_changed']} in reward, "
                  f"{doc['unconsumed_changed']} consumed by no step); {len(doc['steps'])} steps and "
                  f"{len(doc['versions'])} of {doc['versions_published']} versions tainted, first version "
                  f"{'-' if doc['first_tainted_version'] is None else doc['first_tainted_version']}; "
                  f"{doc['sampled_from_tainted']} rollouts sampled from tainted versions")
    if changed:
        t = Table("rollout", "prompt", "from v", "step", "recorded", "new", title="changed outcomes",
                  title_justify="left")
        for c in changed[:shown]:
            old, new = c["recorded"], c["new"]
            t.add_row(str(c["rollout_id"]), str(c["prompt_index"]), str(c["policy_version"]),
                      "-" if c["consumed_by_step"] is None else str(c["consumed_by_step"]),
                      f"{old['verdict']} {old['reward']:.6g}", f"{new['verdict']} {new['reward']:.6g}")
        console.print(t)
        if shown is not None and len(changed) > shown:
            console.print(f"… and {len(changed) - shown} more (--all lists them all)")
    if doc["steps"]:
        t = Table("step", "changed rollouts", "of batch", "produced", title="tainted steps", title_justify="left")
        for s in doc["steps"]:
            t.add_row(str(s["step"]), str(len(s["changed_rollouts"])), str(s["batch_rollouts"]),
                      "-" if s["produced_version"] is None else str(s["produced_version"]))
        console.print(t)
    if doc["versions"]:
        t = Table("version", "digest", "parent", "why", "sampled rollouts", title="tainted versions",
                  title_justify="left")
        for v in doc["versions"]:
            why = ", ".join(w for w, on in (("changed batch", v["trained_on_changed"]),
                                            ("tainted parent", v["parent_tainted"])) if on)
            t.add_row(str(v["version"]), v["digest"][:16], str(v["parent_version"]), why, str(v["sampled_rollouts"]))
        console.print(t)


__all__ = ["BUILTIN", "rejudge", "render", "scoring_config", "taint", "taint_run"]
