"""``rlx worker ROLE`` and ``rlx controller``: a run's roles as processes, on one machine or many.

``rlx controller --ledger URL --params URL --listen HOST:PORT`` serves one run to its workers:
it creates the run from a config (``--config``/``--set``) if the ledger does not hold it, and
otherwise continues it under a new writer epoch (an older controller still running is fenced).
``rlx worker inference|verifier|trainer --controller HOST:PORT[,HOST:PORT]`` is one worker;
``rlx worker trainer --gang RANK/SIZE --coordinator unix:PATH|HOST:PORT`` one rank of a trainer gang
(``runtime.trainer.gang``), on this machine or another.
Both listen and connect with the rules of every rlx service: loopback by default, a token for
any other address (``$RLX_TOKEN`` or ``--token-file``), TLS by flags. A controller on loopback
given no token makes one, kept in a file only its user can read (``--token-out``), which its
workers read with ``--token-file``.
"""

from __future__ import annotations

import argparse

from runtime.commands.arguments import seconds
from runtime.commands.run import add_config_arguments
from runtime.commands.serve import add_listen_arguments

MAX_RETRY_FOR_S = 7 * 24 * 3600.0


def register(subparsers: argparse._SubParsersAction) -> None:
    from runtime.controller.workers import ROLES

    p = subparsers.add_parser("worker", help="one worker process (inference, verifier or trainer) of a run")
    p.add_argument("role", choices=ROLES, help="what the worker does")
    p.add_argument("--controller", required=True, metavar="HOST:PORT[,HOST:PORT]",
                   help="the controller's address (several: tried in turn when one does not answer)")
    p.add_argument("--worker-id", help="the id to join under (default ROLE-HOST-PID); a rejoin appends ~N")
    p.add_argument("--token-file", metavar="FILE", help="file holding the controller's token (default: $RLX_TOKEN)")
    p.add_argument("--tls-root-cert", metavar="PEM", help="CA of the controller's certificate: connect with TLS")
    p.add_argument("--tls-client-cert", metavar="PEM", help="this worker's certificate (mutual TLS)")
    p.add_argument("--tls-client-key", metavar="PEM", help="this worker's key (with --tls-client-cert)")
    p.add_argument("--retry-for", type=seconds(0, MAX_RETRY_FOR_S), default=600.0, metavar="S",
                   help=f"give up after S seconds without a controller (default 600; at most {MAX_RETRY_FOR_S:g})")
    p.add_argument("--gang", metavar="RANK/SIZE",
                   help="trainer only: this process is rank RANK of a trainer gang of SIZE processes "
                        "(jax.distributed); rank 0 serves the coordinator and talks to the controller")
    p.add_argument("--coordinator", metavar="unix:PATH|HOST:PORT",
                   help="with --gang: the address rank 0 serves the gang's coordinator on (every rank the same); "
                        "on one machine a Unix socket in a directory only you can enter (mode 700), across "
                        "machines an address on a network private to the gang (the coordinator has no authentication)")
    p.add_argument("--exit-with-parent", action="store_true",
                   help="exit when the process that started this one exits (used by rlx run)")
    p.set_defaults(func=cmd_worker)

    c = subparsers.add_parser("controller", help="serve a run's controller to worker processes over gRPC")
    c.add_argument("--ledger", required=True, help="ledger URL (PostgreSQL for runs that span machines, or SQLite)")
    c.add_argument("--params", required=True, help="parameter store URL every worker can reach")
    c.add_argument("--listen", default="127.0.0.1:7000", metavar="HOST:PORT",
                   help="address to serve workers on (default 127.0.0.1:7000; any other host needs a token)")
    c.add_argument("--run", dest="run_id", help="run id (default: run.name of the config)")
    add_config_arguments(c)  # of a new run; a run the ledger holds goes on with its logged config (same or none)
    add_listen_arguments(c, port=False)
    c.add_argument("--token-out", metavar="FILE",
                   help="given no token, where the controller keeps the one it makes (mode 0600; kept for its "
                        "successors) and its workers read it with --token-file (default: controller.token beside "
                        "a SQLite ledger, else in the current directory)")
    c.set_defaults(func=cmd_controller, steps_field="run.steps")


def cmd_worker(args: argparse.Namespace) -> int:
    from runtime import compile_cache
    from runtime.service.client import parse_targets
    from runtime.service.worker import main
    from verifiers.service.security import load_token

    gang = None
    if args.gang is not None or args.coordinator is not None:
        from runtime.errors import UsageError
        from runtime.trainer.gang import GangSpec

        if args.role != "trainer":
            raise UsageError(f"--gang is for trainer workers, not {args.role!r}")
        gang = GangSpec.parse(args.gang or "", args.coordinator)
    targets = parse_targets(args.controller)
    token = load_token(args.token_file)
    tls = {"root_cert": args.tls_root_cert, "client_cert": args.tls_client_cert, "client_key": args.tls_client_key}
    if args.exit_with_parent:
        from runtime.service.worker import exit_with_parent

        exit_with_parent()
    compile_cache.enable()  # a worker compiles what every worker of its role compiled before
    return main(args.role, targets, worker_id=args.worker_id, token=token, tls=tls, retry_for_s=args.retry_for,
                gang_spec=gang)


def cmd_controller(args: argparse.Namespace) -> int:
    import json

    from runtime.commands.run import config_from_args
    from runtime.deploy import serve_controller
    from runtime.errors import UsageError

    host, sep, port = args.listen.rpartition(":")
    if not sep or not port.isdigit():
        raise UsageError(f"--listen {args.listen!r} is not HOST:PORT (e.g. 127.0.0.1:7000)")
    args.host, args.port = host, int(port)
    given = args.config is not None or bool(args.overrides) or any(
        getattr(args, flag) is not None for flag in ("steps", "seed", "model", "data"))
    if args.run_id is not None:
        args.overrides.append(f"run.name={json.dumps(args.run_id)}")
    from runtime.commands.serve import listen_settings

    address, security = listen_settings(args)
    summary = serve_controller(args.ledger, args.params, address, security, run_id=args.run_id,
                               config=config_from_args(args), config_given=given, token_out=args.token_out)
    print(json.dumps(summary, sort_keys=True), flush=True)
    return 0
