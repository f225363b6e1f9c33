"""The ``rlx`` command line.

Each command group lives in its own module under ``runtime.commands`` and exposes
``register(subparsers)``; a registered parser sets ``func`` to a callable taking the parsed
arguments and returning an exit status. Modules import their heavy dependencies (JAX, gRPC)
inside the command functions so that ``rlx --help`` and the ledger tools start fast.

Every refusal is one line on stderr, ``rlx: error: …``, with exit status 2: a user error raised
by a command, an argument argparse rejects, and a bad ``RLX_FAILPOINTS`` (read before any
command runs).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

COMMAND_MODULES = (
    "runtime.commands.run",
    "runtime.commands.ledger",
    "runtime.commands.verify",
    "runtime.commands.serve",
    "runtime.commands.worker",
    "runtime.commands.replay",
    "runtime.commands.fork",
    "runtime.commands.audit",
    "runtime.commands.curate",
    "runtime.commands.export",
    "runtime.commands.models",
    "runtime.commands.config",
)


def _user_error_types() -> tuple[type[BaseException], ...]:
    """The exception bases whose messages are shown as one line instead of a traceback."""
    from ledger.errors import LedgerError
    from runtime.errors import RlxError

    types: list[type[BaseException]] = [LedgerError, RlxError]
    try:
        from verifiers.errors import VerifierError
    except ImportError:  # the verifiers package may be absent in a partial checkout
        pass
    else:
        types.append(VerifierError)
    return tuple(types)


class _Parser(argparse.ArgumentParser):
    """An argument parser whose refusals are one line (argparse prints its usage first), naming
    the command whose ``--help`` lists what it accepts."""

    def error(self, message: str) -> NoReturn:
        print(f"rlx: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="rlx",
        description="Event-sourced reinforcement learning for LLMs: every decision is in the ledger.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    passthrough: list[str] = []
    if "--" in argv:  # what follows belongs to another tool (e.g. Beam pipeline options)
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    if passthrough and not getattr(args, "takes_passthrough", False):
        parser.error(f"unexpected arguments after --: {' '.join(passthrough)}")
    args.passthrough = passthrough
    errors = _user_error_types()
    try:
        from runtime import failpoints

        failpoints.check()
        status = args.func(args)
    except errors as e:
        print(f"rlx: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rlx: interrupted", file=sys.stderr)
        return 130
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
