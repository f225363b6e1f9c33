"""``rlx fork RUN --at VERSION --out DIR``: a new run that shares RUN's history up to VERSION and
goes on with some settings changed (``runtime.fork``)."""

from __future__ import annotations

import argparse

from runtime.commands.arguments import count


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("fork", help="start a run that shares another run's history up to a version and goes on "
                                           "with some settings changed")
    p.add_argument("parent", metavar="RUN", help="the parent's run directory")
    p.add_argument("--at", type=count(0, 2**63 - 1), required=True, metavar="VERSION",
                   help="the version the fork starts from (the parent must still keep it)")
    p.add_argument("--out", required=True, help="the fork's run directory (new or empty)")
    p.add_argument("--run", dest="run_id", help="the parent's run id (default: the only run in RUN)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="a setting the fork changes, e.g. --set trainer.learning_rate=3e-3 (repeatable)")
    p.add_argument("--no-run", action="store_true", help="only create the fork; `rlx resume DIR` runs it")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")
    p.set_defaults(func=cmd_fork)


def cmd_fork(args: argparse.Namespace) -> int:
    from rich.console import Console

    from runtime import compile_cache
    from runtime.commands.run import run_fork
    from runtime.fork import fork_run

    console = Console()
    fork_run(args.parent, args.out, at=args.at, overrides=args.overrides, run_id=args.run_id,
             log=lambda m: console.print(m, highlight=False))
    return run_fork(args.out, args.no_run, args.no_progress, console, compile_cache)

