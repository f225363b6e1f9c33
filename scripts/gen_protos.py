#!/usr/bin/env python
"""Regenerate the protobuf and gRPC stubs of rlx's services (verifier, controller).

    python scripts/gen_protos.py          # writes verifiers/_generated/ and runtime/_generated/
    python scripts/gen_protos.py --check  # exits 1 if the committed stubs are stale

Reads every ``*.proto`` in ``<package>/protos/``; the stubs land in ``<package>/_generated/``
with their imports made absolute (``from <package>._generated import ...``). The generated files
are committed and never edited by hand.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("verifiers", "runtime")


def generate(package: str, out_dir: pathlib.Path) -> list[pathlib.Path]:
    from grpc_tools import protoc

    PROTOS, PACKAGE = ROOT / package / "protos", f"{package}._generated"
    protos = sorted(PROTOS.glob("*.proto"))
    if not protos:
        raise SystemExit(f"gen_protos: no .proto file in {PROTOS}")
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTOS}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *map(str, protos),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("gen_protos: protoc failed")
    written = sorted(out_dir.glob("*_pb2*.py*"))
    modules = [p.stem.split(".")[0] for p in protos]
    for path in written:
        text = path.read_text()
        for module in modules:
            text = re.sub(
                rf"^import {module}_pb2 as", f"from {PACKAGE} import {module}_pb2 as", text, flags=re.M
            )
        path.write_text(text)
    init = out_dir / "__init__.py"
    init.write_text('"""Generated protobuf and gRPC stubs (scripts/gen_protos.py). Do not edit."""\n')
    return [*written, init]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed stubs are stale")
    args = parser.parse_args()
    if args.check:
        stale = []
        for package in PACKAGES:
            out = ROOT / package / "_generated"
            with tempfile.TemporaryDirectory() as tmp:
                fresh = generate(package, pathlib.Path(tmp))
                stale += [f"{package}/_generated/{p.name}" for p in fresh if not (out / p.name).exists()
                          or (out / p.name).read_text() != p.read_text()]
        print(json.dumps({"stale": stale}))
        return 1 if stale else 0
    written = []
    for package in PACKAGES:
        out = ROOT / package / "_generated"
        out.mkdir(exist_ok=True)
        written += generate(package, out)
    print(json.dumps({"written": [str(p.relative_to(ROOT)) for p in written]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
