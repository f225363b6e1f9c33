"""Running ``rlx`` with one directory mounted read-only: a real read-only bind mount in a private
mount namespace (``unshare -m``), so that even root cannot write there.

Tests run as root, where ``chmod -w`` does not stop a write; a read-only mount does.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_SCRIPT = (
    'mount --bind -o ro "$1" "$1" || exit 97\n'
    'if touch "$1/.rw-probe" 2>/dev/null; then exit 98; fi\n'
    'shift\n'
    'exec "$@"\n'
)
"""Mount ``$1`` read-only over itself, prove that a write fails, then run the command."""

_CLI = "import sys; from runtime.cli import main; sys.exit(main(sys.argv[1:]))"


@functools.lru_cache(maxsize=1)
def unavailable() -> str | None:
    """Why read-only bind mounts cannot be made here, or None when they can."""
    try:
        done = subprocess.run(["unshare", "-m", "sh", "-c", _SCRIPT, "sh", "/tmp", "true"],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare cannot run: {e}"
    if done.returncode != 0:
        return f"no read-only bind mount (unshare -m + mount --bind -o ro): exit {done.returncode} {done.stderr.strip()}"
    return None


def rlx_readonly(directory: str | os.PathLike, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``rlx ARGV`` with ``directory`` mounted read-only; exit 97/98 mean the mount itself failed."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", _SCRIPT, "sh", os.fspath(directory), sys.executable, "-c", _CLI, *argv],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT, check=False,
    )
    assert done.returncode not in (97, 98), f"read-only mount failed: {done.returncode} {done.stderr}"
    return done


def tree_digest(directory: str | os.PathLike) -> dict[str, str]:
    """Relative path → sha256 of every file below ``directory`` (what a reader must leave alone)."""
    import hashlib

    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return out
