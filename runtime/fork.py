"""``rlx fork`` and ``rlx replay --rescore``: a new run that shares another run's history up to a
point of it and goes on from there with some settings changed.

A fork's ledger starts with the parent's events up to the fork point, copied record by record
(kind, version and body bytes), so its hash chain up to there *is* the parent's: the digest at
that seq names the shared history, and ``rlx ledger verify`` checks it against the parent. Then
one ``RunForked`` records the parent (directory, run id, seq and chain digest at the fork point),
the version published there, the settings changed and the whole config from there on; the
controller folds it like a resume (the parent's leases and workers stay behind) and goes on.
Nothing before the fork point is computed again: the weights the fork needs are the parent's
versions, hard-linked into the fork's parameter store (``runtime.params.store.share_version``),
and every random stream is a pure function of (seed, purpose, indices) (``runtime.rng``), so
whatever the change does not touch draws the same numbers (common random numbers). A fork with no
change ends on the parent's final weights.

The fork point of ``rlx fork --at V`` is the ``WeightsPublished`` of version ``V``: what the
parent had decided after it (the next requests, a retirement) is decided again with the fork's
settings. That of a re-scored replay (:func:`rescore`) is just before the first recorded outcome
that the new verifier judges otherwise: everything before it holds under either verifier, and
everything after is re-derived with the new one, so in deterministic mode the fork ends on the
weights of a run that had the new verifier from the start.

Only settings that can change mid-run may change (:data:`CHANGEABLE`); the run's seed, data,
model, batch shape and scheduling stay the parent's.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ledger import events as ev
from runtime.errors import UsageError

Log = Callable[[str], None]

CHANGEABLE: dict[str, tuple[str, ...]] = {
    "run": ("steps",),
    "algorithm": ("options",),
    "trainer": ("learning_rate", "weight_decay", "max_grad_norm", "warmup_steps"),
    "verifier": ("reward", "reward_digest", "isolation", "slots"),
    "eval": ("every_steps", "size", "k", "samples"),
    "params": ("keep_newest",),
    "workers": ("mode", "inference", "verifiers", "lease_timeout_s", "no_progress_s", "devices"),
    "ledger": ("synchronous", "snapshot_every"),
    "log": ("tensorboard",),
}
"""The settings a fork may change, by section: what one step, one verdict or the run's length
reads, and how the work is spread; nothing that shapes the batches, the prompts or the samples."""
OWN = {"ledger": ("url",), "params": ("url",)}
"""Settings a fork always has of its own: its ledger and parameter store are in its directory."""
COPY_CHUNK = 4096
"""Records copied per append from the parent's ledger."""


def _flat(config: Mapping[str, Any]) -> dict[str, Any]:
    return {f"{section}.{field}": value for section, table in config.items() for field, value in table.items()}


def changeable() -> list[str]:
    """Every ``section.field`` a fork may change, sorted."""
    return sorted(f"{section}.{field}" for section, fields in CHANGEABLE.items() for field in fields)


def fork_config(parent: Mapping[str, Any], overrides: Iterable[str], *, requested: int,
                values: Mapping[str, Any] | None = None):
    """The fork's resolved config (a ``runtime.config.Config``) and its changes
    (``section.field`` → ``[parent value, fork value]``): the parent's logged config ``parent``
    with ``overrides`` (``section.field=value``) and then ``values`` (``section.field`` → a value,
    None included) applied. ``requested``: the batches the parent
    had requested at the fork point, which ``run.steps`` may not go below.

    Raises:
      UsageError: an unknown setting or a bad value (one line naming it), or a setting that
        cannot change mid-run.
    """
    from runtime.config import Config, apply_overrides
    from runtime.session import load_reward

    overrides = list(overrides)
    data = apply_overrides(parent, overrides)
    for key, value in (values or {}).items():
        section, field = key.split(".", 1)
        data[section] = {**data.get(section, {}), field: value}
    config = Config.from_dict(data)  # an unknown section or field, or a bad value, is named here
    reward = config.verifier.reward
    if reward != parent["verifier"].get("reward"):  # a new reward file: its digest is the fork's
        digest = None if reward is None else load_reward(reward, None).digest
        config = dataclasses.replace(config, verifier=dataclasses.replace(config.verifier, reward_digest=digest))
    config = config.resolved()
    before, after = _flat(parent), _flat(config.to_dict())
    changes = {key: [before.get(key), value] for key, value in after.items() if before.get(key) != value}
    fixed = sorted(key for key in changes if key.split(".", 1)[1] not in CHANGEABLE.get(key.split(".", 1)[0], ()))
    if fixed:
        key = fixed[0]
        raise UsageError(f"--set {key}={changes[key][1]!r}: {key} cannot change mid-run (it shapes what the parent "
                         f"already sampled or decided); a fork may change {', '.join(changeable())}")
    if config.run.steps < max(requested, 1):
        raise UsageError(f"--set run.steps={config.run.steps}: the parent had already requested batch {requested} "
                         f"at the fork point, so run.steps must be at least {max(requested, 1)}")
    config = dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section), **dict.fromkeys(fields))
                                            for section, fields in OWN.items()})
    return config, changes


def _published_seq(store, run_id: str, version: int) -> tuple[int, list[int]]:
    """The seq of ``WeightsPublished`` ``version`` in the run (0 if never), and every version published."""
    from ledger.codec import decode_body

    seq, versions = 0, []
    for _, r in store.scan_linked(run_id, [ev.WeightsPublished.KIND]):
        e = decode_body(r.kind, r.version, r.body, store.registry)
        assert isinstance(e, ev.WeightsPublished)
        versions.append(e.version)
        if e.version == version and not seq:
            seq = r.seq
    return seq, versions


def _describe(versions: list[int]) -> str:
    return f"0..{max(versions)}" if versions else "none"


def fork_run(parent: str, out: str, *, at: int | None = None, cut: int | None = None,
             overrides: Iterable[str] = (), values: Mapping[str, Any] | None = None, run_id: str | None = None,
             reason: str = "fork", extra_changes: Mapping[str, Any] | None = None, log: Log = print) -> dict[str, Any]:
    """Create the fork of run ``run_id`` of directory ``parent`` in ``out`` (see the module
    docstring), at version ``at`` or after seq ``cut``, with ``overrides`` and ``values`` (as
    :func:`fork_config` takes them); write nothing when it
    is refused. Returns what was recorded: ``run_id``, ``parent_seq``, ``parent_digest``,
    ``version``, ``changes``. The fork is not run: ``runtime.run.resume`` continues it.

    Raises:
      UsageError: no such run, a version it never published or no longer keeps, a bad or
        unchangeable setting, or an ``out`` that cannot be a new run directory.
    """
    from ledger import open_store
    from runtime.controller import snapshot
    from runtime.params import ParamStore, ParamStoreError
    from runtime.rundir import RUN_LEDGER_FILE, RunDir, logged_run

    if not os.path.isdir(parent):
        raise UsageError(f"{parent!r} is not a run directory (a directory holding {RUN_LEDGER_FILE}); "
                         "give the directory of the run to fork")
    source = RunDir(parent)
    source.check_exists()
    target = RunDir(out)
    target.check_creatable()
    if os.path.isdir(out) and os.listdir(out):
        raise UsageError(f"--out {out!r} is not empty; a fork starts a new run directory")
    if os.path.abspath(out) == os.path.abspath(parent):
        raise UsageError(f"--out {out!r} is the parent's own directory; give a new one")
    with open_store(source.ledger, readonly=True) as store:
        run_id = source.select_run(store, run_id)
        logged = logged_run(store, run_id)
        if at is not None:
            if isinstance(at, bool) or not isinstance(at, int) or at < 0:
                raise UsageError(f"--at {at!r} is not accepted; give a version, an integer >= 0")
            cut, published = _published_seq(store, run_id, at)
            if not cut:
                raise UsageError(f"--at {at}: run {run_id!r} never published version {at} (it published "
                                 f"{_describe(published)})")
        assert cut is not None and cut > 0
        report = store.verify(run_id)
        if not report.ok and (report.first_bad_seq or 0) <= cut + 1:
            raise UsageError(f"run {run_id!r} of {parent} is corrupt at seq {report.first_bad_seq}: {report.reason}")
        start, snap = snapshot.fold_to(store, run_id, cut, warn=log)  # from the newest snapshot before the cut
        state = start.state
        parent_config = logged.config_at(cut + 1)
        config, changes = fork_config(parent_config, overrides, requested=state.requested, values=values)
        changes = {**changes, **(extra_changes or {})}
        params_url = source.logged_params(parent_config)
        try:
            pstore = ParamStore.open(params_url)
            stored = set(pstore.versions())
        except ParamStoreError as e:
            raise UsageError(f"the parent's parameter store {params_url} cannot be read: {e}") from None
        gone = sorted(v for v in state.versions.keys() if v not in stored)
        if gone:
            raise UsageError(f"--at {state.latest}: the parent's parameter store {params_url} no longer keeps version "
                             f"{gone[0]}, which the run needs from there (retired since; params.keep_newest or "
                             "params.keep_every keep more versions)")
        from runtime import inputs as run_inputs
        from runtime.session import build_task

        fingerprint = dict(logged.fingerprint)
        if "verifier.reward" in changes:  # the fork reads its own reward file, not the one the parent recorded
            fingerprint["inputs"] = {k: v for k, v in (fingerprint.get("inputs") or {}).items() if k != "reward"}
        located = run_inputs.located(config, fingerprint)
        build_task(located, judge=False, log=lambda m: None)  # the task builds with the fork's settings
        inputs = run_inputs.record(located)
        forked = ev.RunForked(os.path.abspath(parent), run_id, cut, start.digest.hex(), state.latest, changes,
                              config.to_dict(), config.digest(), inputs, reason)
        made = not os.path.exists(out)
        try:
            os.makedirs(out, exist_ok=True)
            _write(store, run_id, target, start, snap, forked, pstore, sorted(state.versions.keys()), config)
        except BaseException:
            _remove(out, made)
            raise
    log(f"forked run {run_id!r} of {parent} at seq {cut} (version {state.latest}, chain digest "
        f"{start.digest.hex()[:16]}…) into {out}" + (f", changing {', '.join(changes)}" if changes else ""))
    return {"run_id": run_id, "parent_seq": cut, "parent_digest": start.digest.hex(), "version": state.latest,
            "changes": changes}


def _write(store, run_id: str, target, start, snap, forked: ev.RunForked, pstore, versions: list[int], config):
    """The fork's ledger (the parent's records up to ``start.seq``, then ``forked`` and its
    decisions; ``snap``, the parent's snapshot the fold started from, so that the fork's resume
    starts there too) and parameter store (``versions`` shared with ``pstore``)."""
    from ledger import open_store
    from runtime.controller import ControllerLoop
    from runtime.params import ParamStore
    from runtime.params.store import share_version

    mine = ParamStore.open(target.params(None), create=True)
    for v in versions:
        share_version(pstore, mine, v)
    with open_store(target.new_ledger(None), create=True, synchronous=config.ledger.synchronous) as fork:
        fork.create_run(run_id)
        epoch = fork.acquire_epoch(run_id)
        chunk: list[tuple[str, int, bytes]] = []
        head = 0
        for r in store.scan(run_id, 1, start.seq):
            chunk.append((r.kind, r.version, r.body))
            if len(chunk) == COPY_CHUNK:
                head = fork._append_encoded(run_id, chunk, head, epoch).seq
                chunk = []
        if chunk:
            head = fork._append_encoded(run_id, chunk, head, epoch).seq
        copied = fork.head(run_id)
        if copied.seq != start.seq or copied.digest != start.digest:
            raise UsageError(f"copying run {run_id!r} up to seq {start.seq} gave another chain head; nothing forked")
        if snap is not None:
            fork.put_snapshot(dataclasses.replace(snap, run_id=run_id))
        ControllerLoop.continue_with(fork, run_id, start, [forked])


def _remove(out: str, made: bool) -> None:
    """Undo a fork that failed while it was written: what it wrote in ``out``."""
    if made:
        shutil.rmtree(out, ignore_errors=True)
        return
    for name in os.listdir(out):
        path = os.path.join(out, name)
        shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.unlink(path)


def check_parents(store, run_id: str) -> list[dict[str, Any]]:
    """For each ``RunForked`` of ``run_id`` in ``store``: whether the run's chain up to the fork
    point is its parent's. The record must follow the seq it names, the run's own chain digest
    there must be the one it names, and, where the parent's ledger can still be opened, the
    parent's digest at that seq too (``parent_checked`` says whether it could)."""
    from ledger import open_store
    from ledger.codec import decode_body
    from ledger.errors import LedgerError
    from runtime.errors import RlxError
    from runtime.rundir import RunDir

    out = []
    for _, r in store.scan_linked(run_id, [ev.RunForked.KIND]):
        e = decode_body(r.kind, r.version, r.body, store.registry)
        assert isinstance(e, ev.RunForked)
        row: dict[str, Any] = {"seq": r.seq, "parent": e.parent, "parent_run": e.parent_run,
                               "parent_seq": e.parent_seq, "parent_digest": e.parent_digest, "version": e.version,
                               "changes": e.changes, "ok": True, "parent_checked": False, "reason": ""}
        own = list(store.scan(run_id, e.parent_seq, e.parent_seq))
        if e.parent_seq != r.seq - 1 or not own or own[0].digest.hex() != e.parent_digest:
            row.update(ok=False, reason=f"the chain digest at seq {e.parent_seq} is not the parent's it names")
        else:
            try:
                with open_store(RunDir(e.parent).ledger, readonly=True) as theirs:
                    at = list(theirs.scan(e.parent_run, e.parent_seq, e.parent_seq))
            except (LedgerError, RlxError, OSError) as err:
                row["reason"] = f"the parent's ledger cannot be read ({err}): only this run's record is checked"
            else:
                row["parent_checked"] = True
                if not at or at[0].digest.hex() != e.parent_digest:
                    row.update(ok=False, reason=f"the parent's ledger has another chain digest at seq {e.parent_seq} "
                                                "(rewritten or repaired since the fork)")
        out.append(row)
    return out


def rescore(parent: str, verifier: str, out: str, *, run_id: str | None = None,
            log: Log = print) -> dict[str, Any] | None:
    """The fork of run ``parent`` re-derived with ``verifier`` (``builtin`` or a reward file, as
    ``rlx audit taint`` takes it) from just before the first outcome it judges otherwise, in
    ``out`` (not run yet: ``runtime.run.resume`` continues it). None when no outcome changes:
    the run stands as it is, and nothing is written."""
    from ledger import open_store
    from runtime.audit.taint import BUILTIN, taint_run
    from runtime.rundir import RunDir

    if not os.path.isdir(parent):
        raise UsageError(f"{parent!r} is not a run directory; give the directory of the run to re-score")
    RunDir(out).check_creatable()
    doc = taint_run(parent, run_id, verifier, log=log)
    if not doc["changed"]:
        log(f"no outcome of run {doc['run_id']!r} changes under {verifier}: the run stands as it is; nothing written")
        return None
    changed = {c["rollout_id"] for c in doc["changed"]}
    with open_store(RunDir(parent).ledger, readonly=True) as store:
        from ledger.codec import decode_body

        first = min(r.seq for _, r in store.scan_linked(doc["run_id"], [ev.OutcomeRecorded.KIND])
                    if getattr(decode_body(r.kind, r.version, r.body, store.registry), "rollout_id", None) in changed)
    from verifiers.reward import split_spec

    if verifier == BUILTIN:
        reward = None
    else:
        path, function = split_spec(verifier)
        reward = f"{os.path.abspath(path)}:{function}"
    names = [f"{v['verifier']} {v['version']}" for v in doc["recorded_verifiers"]]
    news = [f"{v['verifier']} {v['version']}" for v in doc["new_verifiers"]]
    out_doc = fork_run(parent, out, cut=first - 1, values={"verifier.reward": reward}, run_id=doc["run_id"],
                       reason="rescore", extra_changes={"verifier": [names, news]}, log=log)
    return {**out_doc, "first_tainted_version": doc["first_tainted_version"], "changed_outcomes": len(changed)}


__all__ = ["CHANGEABLE", "changeable", "check_parents", "fork_config", "fork_run", "rescore"]
