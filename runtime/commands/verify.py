"""``rlx verify math | code``: judge one answer or one program from the command line.

Exit status 0 when the answer passes, 1 when it does not; a user's mistake (unreadable file,
unknown checker, bad limit) is one line on stderr and status 2, found before anything runs:
every option is range-checked up front and files are read with a size cap. ``--json`` prints one
object with ``passed``, ``verdict`` and ``reward`` first, then the detail and per-test results.
"""

from __future__ import annotations

import argparse
import json

MAX_PROGRAM_BYTES = 16 << 20
MAX_MEMORY_MB = 1 << 20
MAX_TIMEOUT_S = 3600.0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("verify", help="judge a math answer or a program (sandboxed)")
    sub = p.add_subparsers(dest="verify_command", metavar="KIND")
    sub.required = True

    sp = sub.add_parser("math", help="compare a math answer with a reference answer")
    sp.add_argument("--gold", required=True, help="the reference answer, e.g. '\\frac{1}{2}'")
    sp.add_argument("--answer", required=True, help="the response; its final answer is extracted")
    sp.add_argument("--no-extract", action="store_true", help="take --answer whole as the final answer")
    sp.add_argument("--rel-tol", help="relative tolerance for numbers, e.g. 1e-6 (default: exact)")
    sp.add_argument("--abs-tol", help="absolute tolerance for numbers (default: exact)")
    sp.add_argument("--timeout", type=float, default=10.0, help="hard bound on judging, seconds (default 10)")
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    sp.set_defaults(func=cmd_math)

    sp = sub.add_parser("code", help="run a program on stdin/stdout tests in the sandbox")
    sp.add_argument("--program", required=True, metavar="FILE", help="the program's source file")
    sp.add_argument("--tests", required=True, metavar="FILE.jsonl",
                    help='one test per line: {"input": "...", "output": "..."}')
    sp.add_argument("--language", default="python", help="python (default) or c")
    sp.add_argument("--checker", default="tokens", help="exact, tokens (default) or float")
    sp.add_argument("--time-limit", type=float, default=10.0, help="wall seconds per test (default 10)")
    sp.add_argument("--cpu-limit", type=float, default=5.0, help="CPU seconds per test (default 5)")
    sp.add_argument("--memory-mb", type=int, default=512, help="address space per process, MiB (default 512)")
    sp.add_argument("--isolation", default="auto", help="auto (default), namespaces or rlimits")
    sp.add_argument("--all-tests", action="store_true", help="run every test instead of stopping at the first failure")
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    sp.set_defaults(func=cmd_code)


def _report(outcome, as_json: bool) -> int:
    if as_json:
        print(json.dumps(outcome.to_dict(), sort_keys=False))
    else:
        where = f" [{outcome.isolation}]" if outcome.isolation else ""
        print(f"{outcome.verdict.value} reward={outcome.reward:g}{where}: {outcome.detail}")
    return 0 if outcome.passed else 1


def cmd_math(args: argparse.Namespace) -> int:
    from verifiers.math import MathConfig, MathVerifier
    from verifiers.math.config import read_tolerance
    from verifiers.service.bounds import MAX_ABS_TOL, MAX_REL_TOL, seconds, tolerance

    seconds(args.timeout, "--timeout", MAX_TIMEOUT_S)
    config = MathConfig(
        extract=not args.no_extract,
        rel_tol=read_tolerance(tolerance(args.rel_tol, "--rel-tol", MAX_REL_TOL), "rel_tol"),
        abs_tol=read_tolerance(tolerance(args.abs_tol, "--abs-tol", MAX_ABS_TOL), "abs_tol"),
    )
    with MathVerifier(workers=1, timeout_s=args.timeout) as verifier:
        outcome = verifier.verify(args.gold, args.answer, config)
    return _report(outcome, args.json)


def _limits(args: argparse.Namespace):
    """The run limits of ``--time-limit``, ``--cpu-limit`` and ``--memory-mb``, range-checked."""
    from verifiers.code import Limits
    from verifiers.code.limits import MIB
    from verifiers.errors import ConfigError
    from verifiers.service.bounds import seconds

    wall_s = seconds(args.time_limit, "--time-limit", MAX_TIMEOUT_S)
    cpu_s = seconds(args.cpu_limit, "--cpu-limit", MAX_TIMEOUT_S)
    low = 16  # MiB: the floor of Limits.memory_bytes
    if not low <= args.memory_mb <= MAX_MEMORY_MB:
        raise ConfigError(f"--memory-mb {args.memory_mb!r} must be an integer from {low} to {MAX_MEMORY_MB}")
    return Limits(wall_s=wall_s, cpu_s=cpu_s, memory_bytes=args.memory_mb * MIB)


def cmd_code(args: argparse.Namespace) -> int:
    from verifiers.code import CodeProblem, CodeVerifier, load_io_tests
    from verifiers.errors import ConfigError
    from verifiers.files import read_capped

    limits = _limits(args)
    raw = read_capped(args.program, MAX_PROGRAM_BYTES, "program")
    try:
        program = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"program {args.program!r} is not UTF-8 text") from None
    problem = CodeProblem(
        tests=load_io_tests(args.tests),
        checker=args.checker,
        limits=limits,
        language=args.language,
        stop_early=not args.all_tests,
    )
    outcome = CodeVerifier(isolation=args.isolation, slots=1).verify(program, problem)
    return _report(outcome, args.json)
