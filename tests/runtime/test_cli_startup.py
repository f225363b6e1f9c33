"""Every ``rlx`` process (each worker a run starts, each replacement of a killed one) builds the
command line first: building it must not import JAX, PyTorch or a task or model library, which
cost a second or more per process before any work."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("jax", "torch", "transformers", "gguf", "reasoning_gym", "grpc", "sqlalchemy")


def test_building_the_command_line_imports_no_heavy_library():
    code = ("import sys; from runtime.cli import build_parser; build_parser(); "
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
