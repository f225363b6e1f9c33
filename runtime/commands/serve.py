"""``rlx serve SERVICE``: run one of rlx's gRPC services in the foreground.

``rlx serve verifier --port N`` starts one host of a verifier pool (math answers and sandboxed
code); it prints one JSON line with the bound address and runs until interrupted.
"""

from __future__ import annotations

import argparse
import json
import threading


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="run a gRPC service (verifier)")
    sub = p.add_subparsers(dest="serve_command", metavar="SERVICE")
    sub.required = True

    sp = sub.add_parser("verifier", help="serve math and code verification over gRPC")
    sp.add_argument("--port", type=int, required=True, help="TCP port (0: any free port)")
    sp.add_argument("--host", default="[::]", help="address to listen on (default all: [::])")
    sp.add_argument("--slots", type=int, default=4, help="sandboxed runs at once (default 4)")
    sp.add_argument("--math-workers", type=int, default=2, help="math judging processes (default 2)")
    sp.add_argument("--isolation", default="auto", help="auto (default), namespaces or rlimits")
    sp.add_argument("--threads", type=int, default=32, help="RPC handler threads (default 32)")
    sp.set_defaults(func=cmd_verifier)


def cmd_verifier(args: argparse.Namespace) -> int:
    from verifiers.code import CodeVerifier
    from verifiers.errors import ConfigError
    from verifiers.math import MathVerifier
    from verifiers.service import serve

    if args.threads < 1:
        raise ConfigError(f"--threads {args.threads!r} must be >= 1")
    code = CodeVerifier(isolation=args.isolation, slots=args.slots)
    with MathVerifier(workers=args.math_workers) as math:
        server, port = serve(args.port, host=args.host, code=code, math=math, threads=args.threads)
        print(json.dumps({"service": "verifier", "host": args.host, "port": port,
                          "isolation": code.sandbox.level.value}), flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            server.stop(grace=5).wait()
            raise
    return 0
