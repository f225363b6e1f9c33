"""``rlx config reference`` and ``rlx config check``: what a config accepts, and whether one is valid.

``reference`` prints the Markdown reference of every section and field (type, default,
description), generated from the config's declarations (``runtime.config_reference``); it is
the text of ``configs/REFERENCE.md``. ``check`` reads a config file with its overrides exactly as
``rlx run`` does, refuses a bad value in one line, and prints the config with every field
explicit (as JSON), without building or writing anything.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("config", help="the config reference (every section and field), or check a config file")
    commands = p.add_subparsers(dest="config_command", metavar="COMMAND")
    commands.required = True
    r = commands.add_parser("reference", help="print the Markdown reference of every section and field "
                                              "(configs/REFERENCE.md)")
    r.add_argument("--out", metavar="FILE", help="write it to FILE instead of printing it")
    r.set_defaults(func=cmd_reference)
    c = commands.add_parser("check", help="validate a config file and its overrides as rlx run reads them, and "
                                          "print it with every field explicit")
    c.add_argument("config", nargs="?", help="TOML config file (default: the built-in demo's config)")
    c.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override a config value, e.g. --set algorithm.name=rloo (repeatable)")
    c.set_defaults(func=cmd_check)


def cmd_reference(args: argparse.Namespace) -> int:
    from runtime.config_reference import reference

    text = reference()
    if args.out is None:
        print(text, end="")
        return 0
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    import json

    from runtime.config import load_config

    config = load_config(args.config, args.overrides)
    print(json.dumps(config.to_dict(), indent=2))
    return 0
