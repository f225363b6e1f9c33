"""``rlx audit DIR version V | rollout ID | step S | check | diff OTHER | layout | taint --verifier NEW``:
provenance and invariants of a run, where it parts from another, the devices each of its processes
used, and what another verifier would have judged otherwise (``runtime.audit.taint``; exits 1 when
an outcome changes).

Readable tables by default, one JSON object with ``--json``. ``check`` exits 1 when any of
I1–I8 is violated (or the ledger's hash chain is broken) and lists the violating events; a
version the ledger retains that the parameter store lacks, or holds with other weights, is an
I8 violation, also when the whole parameter store is gone. ``diff`` exits 1 when the runs
differ. Every query opens the ledger read-only: it works on a read-only mount.

A provenance query reads only the events it needs (``runtime.audit.index``), so it answers in
seconds on a run of a million events. The table of a version shows the newest links of its parent
chain and the first rollouts of its batch (:data:`SHOWN` of each, with a summary of the rest);
``--all`` lists them all, and ``--json`` always holds every one.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

SHOWN = 12
"""Rows of a long list (parent chain, rollouts of a batch) the table shows without ``--all``."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("audit", help="provenance of a version, rollout or step; invariants I1–I8; diff of two runs")
    p.add_argument("directory", metavar="DIR", help="run directory (ledger.db, params/)")
    sub = p.add_subparsers(dest="audit_command", metavar="QUERY")
    sub.required = True
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--run", dest="run_id", help="the run, when the ledger holds several")
    common.add_argument("--json", action="store_true", help="print one JSON object")

    sp = sub.add_parser("version", parents=[common], help="lineage of a weight version")
    sp.add_argument("number", type=int, metavar="V")
    sp.add_argument("--all", action="store_true",
                    help=f"list the whole parent chain and every rollout of the batch (the table shows "
                         f"{SHOWN} of each by default; --json always has them all)")
    sp.set_defaults(func=cmd_query)
    sp = sub.add_parser("rollout", parents=[common], help="history of one rollout")
    sp.add_argument("number", type=int, metavar="ID")
    sp.set_defaults(func=cmd_query)
    sp = sub.add_parser("step", parents=[common], help="a train step's batch and the version it produced")
    sp.add_argument("number", type=int, metavar="S")
    sp.set_defaults(func=cmd_query)
    sp = sub.add_parser("diff", parents=[common], help="where this run and another first part (weights, rollouts)")
    sp.add_argument("other", metavar="OTHER_DIR", help="the other run directory")
    sp.add_argument("--other-run", dest="other_run_id", help="the other run, when its ledger holds several")
    sp.set_defaults(func=cmd_diff)
    sp = sub.add_parser("check", parents=[common], help="check invariants I1–I8 over the whole ledger")
    sp.set_defaults(func=cmd_check)
    sp = sub.add_parser("layout", parents=[common], help="which devices each process of the run used")
    sp.set_defaults(func=cmd_layout)
    sp = sub.add_parser("taint", parents=[common], help="the outcomes another verifier judges otherwise, the steps "
                        "that consumed them and every version trained after them")
    sp.add_argument("--verifier", required=True, metavar="NEW",
                    help="builtin (the task's own verifier as the code here judges) or a reward file, FILE.py (its "
                         "function reward) or FILE.py:FUNCTION")
    sp.add_argument("--all", action="store_true", help="list every changed outcome (the table shows 12)")
    sp.set_defaults(func=cmd_taint)


def _emit(obj: Any) -> None:
    print(json.dumps(obj, sort_keys=True))


def cmd_query(args: argparse.Namespace) -> int:
    from ledger import open_store
    from runtime.audit.index import query_events
    from runtime.audit.text import RunText
    from runtime.rundir import RunDir

    rundir = RunDir(args.directory)
    rundir.check_exists()
    what, n = args.audit_command, args.number
    with open_store(args.directory, readonly=True) as store:
        run_id = rundir.select_run(store, args.run_id)
        prov = query_events(store, run_id, what, n)
    if what == "step":
        doc = prov.step(n)
    else:
        texts = RunText(prov.run.config if prov.run is not None else {})
        doc = prov.version(n, prompt_text=texts.prompt) if what == "version" else prov.rollout(n, prompt_text=texts.prompt)
        if what == "rollout" and n in prov.completed and prov.completed[n][1].turns:  # a multi-turn episode
            completion = prov.completed[n][1]
            doc["turns"] = texts.turns(completion.tokens.tolist(), completion.turns)
    if args.json:
        _emit({"run_id": run_id, what: doc})
        return 0
    from rich.console import Console

    from runtime.audit import render

    console = Console()
    if what == "version":
        render.version(console, doc, shown=None if args.all else SHOWN)
    else:
        {"rollout": render.rollout, "step": render.step}[what](console, doc)
    return 0


def _stored_versions(directory: str, config: dict) -> tuple[dict[int, str], dict[int, str], str | None]:
    """Digests recomputed from every stored version's arrays, the versions that would not read,
    and why the parameter store could not be read at all (None when it could)."""
    from runtime.params import ParamStoreError
    from runtime.replay import open_params
    from runtime.rundir import RunDir

    url = RunDir(directory).logged_params(config)
    try:
        pstore = open_params(url)
        versions = () if pstore is None else pstore.versions()
    except ParamStoreError as e:
        return {}, {}, f"parameter store {url} cannot be read: {e}"
    if pstore is None:
        return {}, {}, f"no parameter store at {url}"
    stored, unreadable = {}, {}
    for v in versions:
        try:
            stored[v] = pstore.verify(v)
        except ParamStoreError as e:
            unreadable[v] = str(e)
    return stored, unreadable, None


def _vocab_size(config: dict) -> int | None:
    """The vocabulary size of the run's model (I9), None when its checkpoint cannot be read here:
    token ids are then only checked to be >= 0."""
    from runtime.config import Config
    from runtime.errors import RlxError
    from runtime.host.admission import bounds

    try:
        return bounds(Config.from_dict(config)).vocab_size
    except (RlxError, OSError, ValueError):
        return None


def cmd_check(args: argparse.Namespace) -> int:
    from ledger import events as ev
    from runtime.audit import NAMES, check_run
    from runtime.replay import read_run

    source = read_run(args.directory, args.run_id)
    chain = source.chain
    violations, kinds = [], {}
    absent = None
    if chain.ok:
        config: dict = next((s.event.config for s in source.events[:1] if isinstance(s.event, ev.RunStarted)), {})
        stored, unreadable, absent = _stored_versions(args.directory, config)
        violations = check_run(source.events, stored=stored, unreadable=unreadable, absent=absent,
                               vocab_size=_vocab_size(config))
        kinds = {s.seq: s.kind for s in source.events}
    ok = chain.ok and not violations
    rows = [{"invariant": v.invariant, "seq": v.seq, "kind": kinds.get(v.seq, "end"), "message": v.message}
            for v in violations]
    if args.json:
        _emit({
            "run_id": source.run_id, "ok": ok, "events": chain.events,
            "chain": {"ok": chain.ok, "first_bad_seq": chain.first_bad_seq, "reason": chain.reason},
            "params_checked": chain.ok, "params_absent": absent, "violations": rows, "invariants": NAMES,
        })
        return 0 if ok else 1
    from rich.console import Console

    from runtime.audit import render

    render.check(Console(), source.run_id, chain, rows, params_checked=chain.ok)
    return 0 if ok else 1


def cmd_layout(args: argparse.Namespace) -> int:
    """The run's device layout as ``RunStarted`` recorded it, and the devices each worker that
    joined reported (``runtime.placement.joined_info``), in the order they joined."""
    from ledger import events as ev
    from ledger import open_store
    from runtime.audit.index import read_kinds
    from runtime.rundir import RunDir

    rundir = RunDir(args.directory)
    rundir.check_exists()
    with open_store(args.directory, readonly=True) as store:
        run_id = rundir.select_run(store, args.run_id)
        events = read_kinds(store, run_id, ("RunStarted", "WorkerJoined"))
    layout, workers = None, []
    for s in events:
        e = s.event
        if isinstance(e, ev.RunStarted):
            layout = e.fingerprint.get("layout")
        elif isinstance(e, ev.WorkerJoined) and "placement" in e.info:
            workers.append({"seq": s.seq, "worker_id": e.worker_id, "role": e.role, **e.info["placement"]})
    if args.json:
        _emit({"run_id": run_id, "layout": layout, "workers": workers})
        return 0
    from rich.console import Console

    from runtime.audit import render

    render.layout(Console(), run_id, layout, workers)
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    from runtime.audit.diff import diff_runs
    from runtime.replay import read_run

    a, b = read_run(args.directory, args.run_id), read_run(args.other, args.other_run_id)
    a.chain.raise_if_bad()
    b.chain.raise_if_bad()
    doc = diff_runs(a.events, b.events)
    if args.json:
        _emit({"a": {"directory": args.directory, "run_id": a.run_id},
               "b": {"directory": args.other, "run_id": b.run_id}, **doc})
        return 0 if doc["identical"] else 1
    print(f"A: run {a.run_id} in {args.directory}\nB: run {b.run_id} in {args.other}")
    fork = doc["fork_point"]
    if fork is not None:  # one history up to the fork point: what differs is what the fork changed
        who = " and ".join(side.upper() for side in fork["forked"])
        print(f"fork point: A and B share their hash chain up to seq {fork['seq']} (version {fork['version']}, "
              f"chain digest {fork['parent_digest'][:16]}); {who} forked there")
        for side in fork["forked"]:
            for key, (x, y) in fork["changes"][side].items():
                print(f"  {side.upper()} changed {key}: {x!r} → {y!r}")
    for what in ("fingerprint",) if fork is not None else ("config", "fingerprint"):
        for key, (x, y) in doc[f"{what}_differences"].items():
            print(f"{what} differs: {key} = {x!r} in A, {y!r} in B")
    compared = f"{doc['versions_compared']} common versions and {doc['rollouts_compared']} common rollouts"
    extra = [f"{doc[f'{what}_only_{side}']} {what} only in {side.upper()}" for side in "ab"
             for what in ("versions", "rollouts") if doc[f"{what}_only_{side}"]]
    if extra:
        print("lengths differ: " + ", ".join(extra))
    if doc["identical"]:
        print(f"identical: {compared}, bit for bit")
        return 0
    v = doc["first_divergent_version"]
    if v is None:
        print(f"weights identical over {doc['versions_compared']} common versions")
    else:
        print(f"weights identical up to version {v['version'] - 1}; version {v['version']} differs: "
              f"{v['digest_a'][:16]} in A, {v['digest_b'][:16]} in B")
        cause = v["cause"]
        print(f"  why: {cause['message']}")
        first = cause.get("first_rollout")
        if first:
            print(f"  first differing rollout of the batch: {first['rollout_id']}: {first['message']}")
    r = doc["first_divergent_rollout"]
    if r is not None:
        weights = "identical" if r["weights_same"] else "differing"
        print(f"first differing rollout: {r['rollout_id']} (sampled from version {r['policy_version']}, "
              f"{weights} weights): {r['message']}")
        if r["weights_same"]:
            print("  the same weights, prompt and seed gave another sample: the sampler parted, not training")
    return 1


def cmd_taint(args: argparse.Namespace) -> int:
    import sys

    from runtime.audit import taint

    doc = taint.taint_run(args.directory, args.run_id, args.verifier, log=lambda m: print(m, file=sys.stderr))
    if args.json:
        _emit(doc)
    else:
        from rich.console import Console

        taint.render(Console(), doc, shown=None if args.all else taint.SHOWN)
    return 1 if doc["changed"] else 0
