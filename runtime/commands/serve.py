"""``rlx serve SERVICE``: run one of rlx's gRPC services in the foreground.

``rlx serve verifier --port N`` starts one host of a verifier pool (math answers and sandboxed
code); it prints one JSON line with the bound address and runs until interrupted. It listens on
127.0.0.1 unless ``--host`` says otherwise; any other address needs a token (``$RLX_TOKEN`` or
``--token-file``) that every call must carry, and ``--tls-cert``/``--tls-key`` turn on TLS.
Every option is checked before the sandbox or a worker starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import threading

MAX_SLOTS = 256
MAX_MATH_WORKERS = 64
MAX_MEMORY_MB = 1 << 20


def add_listen_arguments(parser: argparse.ArgumentParser, *, port: bool = True) -> None:
    """``--host``, ``--port`` and the token/TLS options, shared by every rlx gRPC service
    (without ``port``, only the token/TLS options: the command takes its address otherwise)."""
    if port:
        parser.add_argument("--port", type=int, required=True, help="TCP port (0: any free port)")
        parser.add_argument("--host", default="127.0.0.1",
                            help="address to listen on (default 127.0.0.1; any other needs a token)")
    parser.add_argument("--token-file", metavar="FILE",
                        help="file holding the bearer token callers must send (default: $RLX_TOKEN)")
    parser.add_argument("--tls-cert", metavar="PEM", help="server certificate chain: serve TLS")
    parser.add_argument("--tls-key", metavar="PEM", help="server private key (with --tls-cert)")
    parser.add_argument("--tls-client-ca", metavar="PEM", help="CA of client certificates: require them")


def listen_settings(args: argparse.Namespace):
    """The checked listen address and security settings of ``add_listen_arguments``' options."""
    from verifiers.service.security import ListenAddress, ServerSecurity, load_token

    address = ListenAddress(args.host, args.port)
    security = ServerSecurity(
        token=load_token(args.token_file),
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
    )
    security.check(address)
    security.credentials()  # reads and checks the PEM files now, not at bind time
    check_bindable(address)
    return address, security


def check_bindable(address) -> None:
    """Refuse, in one line, an address this process could not listen on (a port in use, an
    address not this host's), before anything is started or created; gRPC would log it from C
    first. Port 0 (any free port) always binds."""
    import socket

    from verifiers.errors import ConfigError

    if address.port == 0:
        return
    try:
        for family, kind, proto, _, where in socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM,
                                                                flags=socket.AI_PASSIVE):
            with socket.socket(family, kind, proto) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC's listener does
                s.bind(where)
    except OSError:  # the words of ServerSecurity.bind, which gRPC's own failure gets
        raise ConfigError(f"cannot listen on {address.target}: the port is in use or the address is not this "
                          "host's") from None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="run a gRPC service (verifier)")
    sub = p.add_subparsers(dest="serve_command", metavar="SERVICE")
    sub.required = True

    sp = sub.add_parser("verifier", help="serve math and code verification over gRPC")
    add_listen_arguments(sp)
    sp.add_argument("--slots", type=int, default=4, help=f"sandboxed runs at once, 1..{MAX_SLOTS} (default 4; a check script takes 2)")
    sp.add_argument("--math-workers", type=int, default=2,
                    help=f"math judging processes, 1..{MAX_MATH_WORKERS} (default 2)")
    sp.add_argument("--isolation", default="auto", help="auto (default), namespaces or rlimits")
    sp.add_argument("--threads", type=int, default=32, help="RPC handler threads (default 32)")
    sp.add_argument("--max-wall-s", type=float, default=120.0, help="largest wall limit a request may ask (120)")
    sp.add_argument("--max-cpu-s", type=float, default=60.0, help="largest CPU limit a request may ask (60)")
    sp.add_argument("--max-memory-mb", type=int, default=4096, help="largest memory limit, MiB (4096)")
    sp.add_argument("--max-output-mb", type=int, default=64, help="largest output limit, MiB (64)")
    sp.add_argument("--max-tests", type=int, default=10_000, help="most tests in one request (10000)")
    sp.add_argument("--max-program-kb", type=int, default=1024, help="largest program source, KiB (1024)")
    sp.add_argument("--max-batch", type=int, default=1024, help="most programs in one batch (1024)")
    sp.add_argument("--max-math-timeout-s", type=float, default=60.0, help="longest math judging (60)")
    sp.set_defaults(func=cmd_verifier)


def _count(value: int, flag: str, low: int, high: int) -> int:
    from verifiers.errors import ConfigError

    if not low <= value <= high:
        raise ConfigError(f"{flag} {value!r} must be an integer from {low} to {high}")
    return value


def server_config(args: argparse.Namespace):
    """The request ceilings of ``rlx serve verifier``'s ``--max-*`` options."""
    from verifiers.code.limits import MIB
    from verifiers.service.bounds import ServerConfig, seconds

    defaults = ServerConfig()
    limits = dataclasses.replace(
        defaults.max_limits,
        wall_s=seconds(args.max_wall_s, "--max-wall-s"),
        cpu_s=seconds(args.max_cpu_s, "--max-cpu-s"),
        memory_bytes=_count(args.max_memory_mb, "--max-memory-mb", 16, MAX_MEMORY_MB) * MIB,
        output_bytes=_count(args.max_output_mb, "--max-output-mb", 1, MAX_MEMORY_MB) * MIB,
    )
    return ServerConfig(
        max_limits=limits,
        max_tests=_count(args.max_tests, "--max-tests", 1, 1_000_000),
        max_program_bytes=_count(args.max_program_kb, "--max-program-kb", 1, 64 * 1024) * 1024,
        max_batch=_count(args.max_batch, "--max-batch", 1, 100_000),
        max_math_timeout_s=seconds(args.max_math_timeout_s, "--max-math-timeout-s"),
    )


def cmd_verifier(args: argparse.Namespace) -> int:
    from verifiers.code import CodeVerifier
    from verifiers.code.sandbox import resolve
    from verifiers.math import MathVerifier
    from verifiers.service import serve
    from verifiers.service.server import MAX_THREADS

    address, security = listen_settings(args)
    config = server_config(args)
    _count(args.threads, "--threads", 1, MAX_THREADS)
    _count(args.slots, "--slots", 1, MAX_SLOTS)
    _count(args.math_workers, "--math-workers", 1, MAX_MATH_WORKERS)
    resolve(args.isolation)
    code = CodeVerifier(isolation=args.isolation, slots=args.slots)
    with code.sandbox, MathVerifier(workers=args.math_workers) as math:
        server, port = serve(address.port, host=address.host, code=code, math=math, threads=args.threads,
                             config=config, security=security)
        print(json.dumps({"service": "verifier", "host": address.host, "port": port,
                          "isolation": code.sandbox.level.value, "token": security.token is not None,
                          "tls": security.tls_cert is not None}), flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            server.stop(grace=5).wait()
            raise
    return 0
