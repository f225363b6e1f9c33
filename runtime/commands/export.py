"""``rlx export DIR --version V --out HF_DIR``: a trained version as a Hugging Face checkpoint."""

from __future__ import annotations

import argparse
import re

_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]i?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def shard_size(text: str) -> int:
    """Bytes from ``"5GB"``, ``"500MiB"`` or a plain number (KB/MB/GB decimal, KiB/MiB/GiB binary,
    as Transformers' ``max_shard_size``)."""
    match = _SIZE.match(text)
    if match is None or int(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size; give a positive number of bytes, optionally with KB, MB, GB, KiB, MiB or GiB")
    return int(match.group(1)) * _UNITS[(match.group(2) or "").lower()]


def register(subparsers: argparse._SubParsersAction) -> None:
    from runtime.export import EXPORT_DTYPES

    p = subparsers.add_parser(
        "export", help="write a trained version of a run as a Hugging Face checkpoint (config, safetensors, tokenizer)")
    p.add_argument("directory", metavar="DIR", help="run directory (ledger.db, params/)")
    p.add_argument("--version", type=int, required=True, metavar="V", help="the version to export (0 = the initial weights)")
    p.add_argument("--out", required=True, metavar="HF_DIR", help="a new or empty directory for the checkpoint")
    p.add_argument("--run", dest="run_id", help="the run, when the ledger holds several")
    p.add_argument("--dtype", choices=EXPORT_DTYPES,
                   help="the tensors' dtype (default: each tensor's dtype in the checkpoint the run started from; "
                        "the trained dtype for the built-in model)")
    p.add_argument("--max-shard-size", type=shard_size, default="5GiB", metavar="SIZE",
                   help="weights above this size are split into shards with an index (default 5GiB)")
    p.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from runtime.export import export_version
    from runtime.rundir import check_creatable

    check_creatable(args.out, "--out")  # before the ledger is read or a tensor loaded
    done = export_version(args.directory, args.version, args.out, run_id=args.run_id, dtype=args.dtype,
                          max_shard_bytes=args.max_shard_size)
    weights = sum(name.endswith(".safetensors") for name in done.files)
    print(f"exported version {done.version} of run {done.run_id} (digest {done.digest[:16]}…, "
          f"{'/'.join(done.dtypes)}, {weights} safetensors file{'s' * (weights != 1)}; model from {done.source}) "
          f"to {done.out}: {', '.join(done.files)}")
    return 0
