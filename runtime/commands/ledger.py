"""``rlx ledger verify | repair | stats | tail | export``: tools over a ledger.

Every command takes a store URL, a SQLite file path or a run directory (``DIR/ledger.db``).
Only ``export`` creates anything (the JSON lines it is asked for);
the others never create or modify files they were not asked to (``repair`` modifies the ledger
it is pointed at, and only to cut a torn tail). ``verify``, ``stats``, ``tail`` and ``export``
open the ledger read-only, so they work on a read-only mount and never convert a file that is
not a ledger.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from runtime.commands.arguments import count
from runtime.rundir import pointed_run  # importing it also lets open_store take a run directory


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("ledger", help="inspect, verify, repair and export a ledger")
    sub = p.add_subparsers(dest="ledger_command", metavar="ACTION")
    sub.required = True

    def target(sp: argparse.ArgumentParser, run: bool = True) -> None:
        sp.add_argument("target", metavar="PATH_OR_URL", help="ledger URL, SQLite file or run directory")
        if run:
            sp.add_argument("--run", dest="run_id", help="only this run (default: every run)")
        sp.add_argument("--json", action="store_true", help="print one JSON object")

    sp = sub.add_parser("verify", help="recompute the hash chain, decode every event and prove the controller's snapshots")
    target(sp)
    sp.set_defaults(func=cmd_verify)

    sp = sub.add_parser("repair", help="cut a torn tail back to the last valid event")
    target(sp)
    sp.add_argument("--force", action="store_true", help="also cut corruption in the middle (loses the valid events after it)")
    sp.set_defaults(func=cmd_repair)

    sp = sub.add_parser("stats", help="events by kind, runs, bytes")
    target(sp, run=False)
    sp.set_defaults(func=cmd_stats)

    sp = sub.add_parser("tail", help="print the last events of a run, optionally following new ones")
    target(sp)
    sp.add_argument("-n", type=int, default=20, help="how many of the last events (default 20)")
    sp.add_argument("--from", dest="from_seq", type=count(1, 2**63 - 1), help="start at this seq instead of the last N")
    sp.add_argument("--follow", "-f", action="store_true", help="keep printing new events as they commit")
    sp.set_defaults(func=cmd_tail)

    sp = sub.add_parser("export", help="JSON rows per rollout, policy version and step (an Apache Beam pipeline)",
                        description="Join every rollout's request, leases, completion, outcome, consuming step, prompt "
                                    "and completion text into OUT/rollouts-*.jsonl, per-version statistics into "
                                    "OUT/versions-*.jsonl and per-step rows into OUT/steps-*.jsonl, with an Apache Beam "
                                    "pipeline. Arguments after -- are Beam pipeline options, e.g. "
                                    "-- --runner=DirectRunner --direct_num_workers=2 --direct_running_mode=multi_processing "
                                    "(with RLX_ALLOW_BEAM_GRPC=1: that mode opens Beam's gRPC ports on every interface, with no token)")
    target(sp)
    sp.add_argument("--out", required=True, help="output directory (or a URL the Beam runner can write)")
    sp.add_argument("--range-events", type=int, default=20_000, help="events per parallel read (default 20000)")
    sp.add_argument("--format", choices=("json", "parquet"), default="json",
                    help="JSON lines (default) or Parquet files with explicit schemas (Beam's Parquet sink)")
    sp.set_defaults(func=cmd_export, takes_passthrough=True)


def open_target(target: str, *, create: bool = False, readonly: bool = False):
    from ledger import open_store

    return open_store(target, create=create, readonly=readonly)


def _runs(store, run_id: str | None, target: str) -> list[str]:
    """``[run_id]``, else the run a run directory's pointer names (its ledger may hold others),
    else every run."""
    from ledger import RunNotFound

    run_id = run_id or pointed_run(target)
    runs = store.runs()
    if run_id is None:
        return runs
    if run_id not in runs:
        raise RunNotFound(run_id, runs)
    return [run_id]


def _emit(obj: Any) -> None:
    print(json.dumps(obj, indent=None, sort_keys=True))


def cmd_verify(args: argparse.Namespace) -> int:
    from runtime.controller import snapshot
    from runtime.fork import check_parents

    with open_target(args.target, readonly=True) as store:
        reports = [store.verify(r) for r in _runs(store, args.run_id, args.target)]
        # A log whose chain holds is folded once more to prove its snapshots: every stored row,
        # every SnapshotTaken and every snapshot a ControllerStarted resumed from.
        proven = {r.run_id: snapshot.proofs(store, r.run_id) if r.ok else [] for r in reports}
        # A fork's chain up to its fork point must be its parent's (runtime.fork).
        parents = {r.run_id: check_parents(store, r.run_id) if r.ok else [] for r in reports}
    ok = all(r.ok and all(p.ok for p in proven[r.run_id]) and all(f["ok"] for f in parents[r.run_id])
             for r in reports)
    if args.json:
        _emit({"ok": ok, "url": store.url, "runs": [
            {**_report_dict(r), "snapshots": [_proof_dict(p) for p in proven[r.run_id]], "forked_from": parents[r.run_id]}
            for r in reports]})
    else:
        if not reports:
            print(f"{store.url}: no runs")
        for r in reports:
            if r.ok:
                good = sum(p.ok for p in proven[r.run_id])
                also = f", {good} snapshot{'s' if good != 1 else ''} proven" if proven[r.run_id] else ""
                print(f"run {r.run_id}: OK, {r.events} events, head seq {r.head_seq}, head digest {r.head_digest[:16]}"
                      + also)
            else:
                hint = "torn tail: `rlx ledger repair` cuts it" if r.torn_tail else "corruption in the middle"
                print(f"run {r.run_id}: CORRUPT at seq {r.first_bad_seq}: {r.reason} ({hint})")
            for f in parents[r.run_id]:
                where = f"run {f['parent_run']} of {f['parent']} up to seq {f['parent_seq']} (version {f['version']})"
                if not f["ok"]:
                    print(f"run {r.run_id}: FORK at seq {f['seq']} does not share the chain of {where}: {f['reason']}")
                else:
                    checked = "checked against the parent's ledger" if f["parent_checked"] else f["reason"]
                    print(f"run {r.run_id}: forked from {where}, chain digest {f['parent_digest'][:16]} ({checked})")
            for p in proven[r.run_id]:
                if not p.ok:
                    named = f" (named by seq {p.by})" if p.by else " (stored row)"
                    print(f"run {r.run_id}: SNAPSHOT at seq {p.seq}{named} is not the fold of the log: {p.reason}")
    return 0 if ok else 1


def _proof_dict(p) -> dict:
    return {"seq": p.seq, "ok": p.ok, "reason": p.reason, "named_by": p.by or None}


def _report_dict(r) -> dict:
    return {
        "run_id": r.run_id,
        "ok": r.ok,
        "events": r.events,
        "head_seq": r.head_seq,
        "head_digest": r.head_digest,
        "first_bad_seq": r.first_bad_seq,
        "reason": r.reason,
        "torn_tail": r.torn_tail,
        "last_good_seq": r.last_good_seq,
    }


def cmd_repair(args: argparse.Namespace) -> int:
    with open_target(args.target) as store:
        results = [store.repair(r, force=args.force) for r in _runs(store, args.run_id, args.target)]
    if args.json:
        _emit({"runs": [
            {"run_id": r.run_id, "truncated_from": r.truncated_from, "removed": r.removed, "head_seq": r.head_seq}
            for r in results
        ]})
    else:
        for r in results:
            if r.truncated_from is None:
                print(f"run {r.run_id}: intact, nothing to repair (head seq {r.head_seq})")
            else:
                print(f"run {r.run_id}: removed {r.removed} events from seq {r.truncated_from}; head seq now {r.head_seq}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    with open_target(args.target, readonly=True) as store:
        stats = store.stats()
    if args.json:
        _emit(stats)
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"[bold]{stats['url']}[/]: {len(stats['runs'])} runs, {stats['events']} events, "
                  f"{stats['body_bytes']} body bytes" + "".join(
                      f", {k.replace('_', ' ')} {v}" for k, v in stats.items() if k.endswith("_bytes") and k != "body_bytes"))
    t = Table("kind", "events", "body bytes")
    for k, n in stats["events_by_kind"].items():
        t.add_row(k, str(n), str(stats["body_bytes_by_kind"][k]))
    console.print(t)
    t = Table("run", "events")
    for r, n in stats["runs"].items():
        t.add_row(r, str(n))
    console.print(t)
    return 0


def summarize(value: Any) -> Any:
    """A short JSON-able view of an event field (arrays as ``dtype[shape]`` with a preview)."""
    if isinstance(value, np.ndarray):
        flat = value.reshape(-1)
        preview = flat[:8].tolist()
        return f"{value.dtype.name}{list(value.shape)}{preview}{'…' if flat.size > 8 else ''}"
    if isinstance(value, dict):
        return {k: summarize(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [summarize(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    return value


def cmd_tail(args: argparse.Namespace) -> int:
    with open_target(args.target, readonly=True) as store:
        if args.n < 1 and args.from_seq is None:
            from runtime.errors import UsageError

            raise UsageError(f"-n {args.n} is not accepted: show at least 1 event (or start at --from SEQ)")
        run = one_run(store, args.run_id, args.target)
        if run is None:
            print(f"{store.url}: no runs")
            return 0
        start = args.from_seq if args.from_seq is not None else max(1, store.head(run).seq - args.n + 1)
        stream = store.follow(run, start) if args.follow else store.read(run, start)
        try:
            for s in stream:
                fields = summarize(s.event.fields())
                if args.json:
                    _emit({"seq": s.seq, "kind": s.kind, "epoch": s.epoch, "fields": fields})
                else:
                    body = " ".join(f"{k}={json.dumps(v)}" for k, v in fields.items())
                    print(f"{s.seq:>8}  {s.kind:<18} {body}")
                sys.stdout.flush()
        except BrokenPipeError:
            pass
    return 0


def one_run(store, run_id: str | None, target: str) -> str | None:
    """The run a single-run command works on: ``run_id``, the run a run directory's pointer
    names, or the ledger's only run."""
    runs = _runs(store, run_id, target)
    if run_id is None and len(runs) != 1:
        if not runs:
            return None
        from ledger import LedgerError

        raise LedgerError(f"this ledger holds {len(runs)} runs; pick one with --run ({', '.join(runs[:10])})")
    return runs[0]


def cmd_export(args: argparse.Namespace) -> int:
    import logging

    beam_args = list(args.passthrough)
    if "://" not in args.out:  # else a URL the Beam runner writes
        from runtime.rundir import check_creatable

        check_creatable(args.out, "--out")
    with open_target(args.target, readonly=True) as store:
        run = one_run(store, args.run_id, args.target)
        first = next(iter(store.read(run, 1, 1)), None) if run is not None else None
    if run is None:
        print(f"{args.target}: no runs")
        return 0
    logging.getLogger().addHandler(logging.NullHandler())  # Beam's import-time notices are not ours to print
    import apache_beam as beam

    from ledger.pipelines import export_run
    from runtime.audit.export import AddText

    config = first.event.config if first is not None and first.kind == "RunStarted" else {}
    counts = export_run(args.target, run, args.out, range_events=args.range_events, pipeline_args=beam_args,
                        annotate=beam.ParDo(AddText(config)), format=args.format)
    if args.json:
        _emit({"run_id": run, "out": args.out, **counts})
    else:
        ext = "jsonl" if args.format == "json" else "parquet"
        print(f"run {run}: {counts['events']} events → {counts['rollouts']} rollout rows, {counts['versions']} "
              f"version rows, {counts['steps']} step rows in {args.out}/rollouts-*.{ext}, versions-*.{ext}, "
              f"steps-*.{ext}")
    return 0


