"""``rlx curate``: the prompts a run solved sometimes, as data for the next run (an Apache Beam pipeline).

Each prompt's pass rate over the rollouts sampled from the chosen policy versions comes from the
ledger (:class:`ledger.pipelines.PromptStats`); the prompts in the pass-rate band (default: mixed
outcomes only, neither never nor always solved) are written as the run's own data rows
(:mod:`runtime.curation`) to ``--out``, a JSONL file ``rlx run --data`` takes, and every sampled
prompt's statistics to ``--stats``.
"""

from __future__ import annotations

import argparse
import json
import os


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "curate", help="keep the prompts a run solved sometimes, as --data for the next run (an Apache Beam pipeline)",
        description="Compute each prompt's pass rate over a run's scored rollouts (from the policy versions chosen) "
                    "and write the prompts whose pass rate is in the band as JSONL data rows for `rlx run --data`, "
                    "plus one statistics row per sampled prompt. Arguments after -- are Beam pipeline options, e.g. "
                    "-- --runner=DirectRunner --direct_num_workers=2 --direct_running_mode=multi_processing "
                    "(with RLX_ALLOW_BEAM_GRPC=1: that mode opens Beam's gRPC ports on every interface, with no token)")
    p.add_argument("target", metavar="RUN", help="run directory, ledger URL or SQLite file")
    p.add_argument("--run", dest="run_id", help="the run (needed when the ledger holds several)")
    p.add_argument("--out", required=True, help="the curated JSONL data file")
    p.add_argument("--stats", help="per-prompt statistics JSONL (default: OUT.stats.jsonl)")
    p.add_argument("--min-pass", metavar="P", help="keep pass rates >= P (default: > 0, drop never-solved prompts)")
    p.add_argument("--max-pass", metavar="Q", help="keep pass rates <= Q (default: < 1, drop always-solved prompts)")
    p.add_argument("--versions", metavar="A:B", help="only rollouts sampled from policy versions A..B inclusive "
                                                      "(A:, :B or V also accepted; default: all)")
    p.add_argument("--force", action="store_true", help="replace OUT and the statistics file if they exist")
    p.add_argument("--range-events", type=int, default=20_000, help="events per parallel read (default 20000)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_curate, takes_passthrough=True)


def cmd_curate(args: argparse.Namespace) -> int:
    import logging

    logging.getLogger().addHandler(logging.NullHandler())  # Beam's import-time notices are not ours to print
    from ledger.pipelines.prompts import PassBand, VersionRange
    from runtime.commands.ledger import one_run, open_target
    from runtime.errors import UsageError
    from runtime.rundir import check_creatable

    band = PassBand.parse(args.min_pass, args.max_pass)
    versions = VersionRange.parse(args.versions)
    stats = args.stats or f"{args.out}.stats.jsonl"
    if os.path.abspath(stats) == os.path.abspath(args.out):
        raise UsageError(f"--stats and --out are the same file {args.out!r}")
    for flag, path in (("--out", args.out), ("--stats", stats)):
        if "://" in path:  # a URL the Beam runner writes
            continue
        if not args.force and os.path.exists(path):
            raise UsageError(f"{path!r} exists; choose another path or pass --force to replace it")
        check_creatable(path, flag, directory=False)
    with open_target(args.target, readonly=True) as store:
        run = one_run(store, args.run_id, args.target)
        if run is None:
            raise UsageError(f"{args.target}: no runs")
        first = next(iter(store.read(run, 1, 1)), None)
    config = first.event.config if first is not None and first.kind == "RunStarted" else {}
    logging.getLogger().addHandler(logging.NullHandler())  # Beam's import-time notices are not ours to print

    from ledger.pipelines import curate_run
    from runtime.curation import DataRows, DataSource

    source = DataSource(config)  # refuse a config or data file that cannot be rebuilt before any worker starts
    for path in (args.out, stats):
        parent = os.path.dirname(os.path.abspath(path))
        if "://" not in path and not os.path.isdir(parent):
            raise UsageError(f"cannot write {path!r}: the directory {parent!r} does not exist")
    counts = curate_run(args.target, run, args.out, stats, data_row=DataRows(config),
                        versions=versions, band=band, range_events=args.range_events,
                        pipeline_args=list(args.passthrough))
    doc = {"run_id": run, "out": args.out, "stats": stats, "versions": versions.describe(),
           "run_args": source.run_args(args.out), **counts}
    if args.json:
        print(json.dumps(doc, sort_keys=True))
    else:
        print(f"run {run}: {counts['events']} events, {counts['prompts']} prompts sampled (versions "
              f"{versions.describe()}), {counts['rollouts']} scored rollouts → {counts['kept']} prompts kept in "
              f"{args.out}; statistics per prompt in {stats}; train on it with `rlx run {doc['run_args']}`")
    if counts["kept"] == 0:
        import sys

        print("rlx: warning: no prompt's pass rate is in the band; the curated file is empty", file=sys.stderr)
    return 0
