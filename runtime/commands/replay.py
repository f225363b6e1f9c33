"""``rlx replay DIR``: re-derive a run from its ledger and check that every bit matches."""

from __future__ import annotations

import argparse
import json
import sys

from runtime.commands.arguments import count


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "replay", help="re-run every train step (and optionally every rollout) from the ledger and compare digests")
    p.add_argument("directory", metavar="DIR", help="run directory (ledger.db, params/)")
    p.add_argument("--run", dest="run_id", help="the run, when the ledger holds several")
    p.add_argument("--from-version", type=count(0, 2**63 - 1), default=0, metavar="V",
                   help="re-train from version V, or the newest version before it the run kept (params.keep_every), "
                        "loaded from the run's parameter store (default 0)")
    p.add_argument("--regenerate", action="store_true",
                   help="also re-sample every rollout and compare tokens and log-prob bits")
    p.add_argument("--check-snapshots", action="store_true",
                   help="also prove that every stored controller snapshot equals the fold of the log up to its seq")
    p.add_argument("--rescore", metavar="VERIFIER",
                   help="re-derive the run with another verifier (builtin, FILE.py or FILE.py:FUNCTION) from just "
                        "before the first outcome it judges otherwise, into a new run directory (--out)")
    p.add_argument("--out", help="with --rescore: the new run directory")
    p.add_argument("--no-progress", action="store_true", help="with --rescore: no live progress bar")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_replay)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cmd_replay(args: argparse.Namespace) -> int:
    from runtime import compile_cache
    from runtime.errors import UsageError
    from runtime.replay import replay_run

    if (args.rescore is None) != (args.out is None):
        raise UsageError("--rescore VERIFIER and --out DIR go together: the re-scored run is a new run directory")
    if args.rescore is not None:
        return _rescore(args)
    compile_cache.enable()
    report = replay_run(
        args.directory, run_id=args.run_id, from_version=args.from_version, regenerate=args.regenerate,
        check_snapshots=args.check_snapshots, log=_stderr, warn=lambda m: _stderr(f"rlx: warning: {m}"),
        progress=True,  # on stderr, with --json too: stdout holds only the answer
    )
    if args.json:
        print(json.dumps(report.to_dict(), sort_keys=True))
        return 0 if report.match else 1
    from rich.console import Console
    from rich.table import Table

    console = Console()
    t = Table(title=f"replay of run {report.run_id!r}", show_header=False)
    t.add_row("result", "[bold green]bit-exact[/]" if report.match else "[bold red]DIVERGES[/]")
    start = f"from version {report.from_version}"
    if report.from_version != report.requested_version:
        start += f", the nearest kept at or before {report.requested_version}"
    t.add_row("versions verified", f"{report.versions_verified} ({start}, {report.steps_total} steps in the ledger)")
    t.add_row("final version", "-" if report.final_version is None
              else f"{report.final_version}  digest {report.final_digest}")
    t.add_row("rollouts re-sampled", str(report.rollouts_regenerated))
    if report.versions_held_max:
        t.add_row("versions held", f"at most {report.versions_held_max} at once")
    if report.episodes_rederived:
        t.add_row("episodes re-derived", f"{report.episodes_rederived} (from the recorded tool results; no tool ran)")
    if args.check_snapshots:
        t.add_row("snapshots proven", str(report.snapshots_checked))
    t.add_row("fingerprint", ", ".join(report.fingerprint_diff) + " differ" if report.fingerprint_diff else "same")
    t.add_row("time", f"{report.seconds:.1f} s")
    console.print(t)
    if not report.match:
        first = report.first_divergence
        assert first is not None  # a mismatch has divergences
        console.print(f"[bold red]first divergence[/] ({first.stage}): {first}", highlight=False)
        if len(report.divergences) > 1:
            console.print(f"{len(report.divergences) - 1} more; --json lists them", highlight=False)
    return 0 if report.match else 1


def _rescore(args: argparse.Namespace) -> int:
    """``--rescore``: the run forked just before the first outcome the new verifier judges
    otherwise (``runtime.fork.rescore``), then run to its end; prints a JSON object with
    ``--json``."""
    from rich.console import Console

    from runtime import compile_cache
    from runtime.commands.run import run_fork
    from runtime.fork import rescore

    console = Console(stderr=args.json)
    made = rescore(args.directory, args.rescore, args.out, run_id=args.run_id,
                   log=lambda m: console.print(m, highlight=False))
    if made is None:
        return 0
    status = run_fork(args.out, False, args.no_progress, console, compile_cache)
    if args.json:
        import json as _json
        import os

        with open(os.path.join(args.out, "summary.json"), encoding="utf-8") as f:
            summary = _json.load(f)
        print(_json.dumps({**made, "final_version": summary["final_version"],
                           "final_digest": summary["final_digest"]}, sort_keys=True))
    return status
