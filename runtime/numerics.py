"""Exact log-probs: what makes the engine's programs and the trainer's give the same bits.

In the exact-log-prob mode (``trainer.exact_logprobs``) the trainer's log-prob of every sampled
token equals, bit for bit, the one the engine recorded when it sampled it. The engine computes a
prompt in a prefill and every later token in a decode step over all its slots; the trainer
computes whole rows of a batch. These things make those programs agree per position:

- **Attention** in a fixed order (``kernels.ordered_attention``): keys a page at a time, every
  sum term by term, on both sides.
- **Row-wise work in one regime.** A projection or the LM head is one matmul over all the rows of
  a call, and XLA:CPU's matmul (Eigen) splits the contraction into blocks whose size it picks from
  the row count: below a few dozen rows the split differs, so a row's bits differ. Likewise a
  reduction over each row (a norm's mean, the log-softmax's sum) is emitted another way for an
  array of fewer than about 4,096 elements. Every call of the mode has at least
  :func:`min_rows` rows (padded with empty rows where it has fewer: an engine with 4 slots, a
  prefill's last positions, a one-row batch), where neither depends on the row count
  (``tests/runtime/test_exact_logprobs.py`` checks the bits).
- **No contraction to fused multiply-adds.** Inside its fusions XLA:CPU turns ``a·b + c`` into
  one FMA where the target has them, and which products it fuses depends on how each program's
  shapes led it to fuse: ``q·k`` rounded in one program, fused into the softmax's subtraction in
  another. The mode compiles for an x86 target without FMA (:data:`NO_FMA_FLAG`); a process must
  start with it in ``XLA_FLAGS`` (rlx sets it for the processes it starts; :func:`exact_env`).
  It costs little: the large matmuls run in Eigen's own kernels, which the flag does not change.
- **Roundings written out.** A narrower compute dtype's rounding that a program may keep or drop
  as it fuses is an operation of its own: the LM head's bfloat16 logits are a float32-accumulated
  product rounded by ``reduce_precision`` (``runtime.model.transformer.exact_head``), because a
  cast of a bfloat16 product to float32 fused into the log-softmax gave other bits in a
  forward-only program than in the engine's, which stores its logits, or in the train step.

The trainer differentiates only its own values: ordered attention's gradient is dense
attention's (``kernels.ordered_attention``), so the backward pass costs what the default step's
does.

Other backends fuse multiply-adds their own way (GPU and TPU compilers), and a mesh with a model
axis splits the contractions: there the mode is refused (:func:`check_exact_backend`), not
approximated.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping

import jax
import jax.numpy as jnp

from runtime.errors import UsageError

EXACT_MIN_ROWS = 64
"""Fewest rows of any matmul in the exact mode."""

EXACT_MIN_ELEMENTS = 8192
"""Fewest elements of any row-wise reduction in the exact mode (twice the size, measured on XLA:CPU,
below which a row reduction is emitted another way)."""

NO_FMA_FLAG = "--xla_cpu_max_isa=AVX"
"""The XLA flag that keeps XLA:CPU's generated code free of fused multiply-adds (AVX has none)."""


def exact_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with :data:`NO_FMA_FLAG` added to its ``XLA_FLAGS`` (for a process rlx starts)."""
    out = dict(env)
    flags = out.get("XLA_FLAGS", "").split()
    if NO_FMA_FLAG not in flags:
        flags = [f for f in flags if not f.startswith("--xla_cpu_max_isa=")] + [NO_FMA_FLAG]
    out["XLA_FLAGS"] = " ".join(flags)
    return out


def exact_flags_set(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``env`` (default: this process's) carries :data:`NO_FMA_FLAG`."""
    env = os.environ if env is None else env
    return NO_FMA_FLAG in env.get("XLA_FLAGS", "").split()


def ensure_exact_process() -> None:
    """Make this process one that compiles without fused multiply-adds: if its ``XLA_FLAGS`` lack
    :data:`NO_FMA_FLAG`, start it again, the same command line with the flag added (``exec``:
    call this before the process has written anything)."""
    if exact_flags_set():
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, list(sys.orig_argv), exact_env(os.environ))


def check_exact_backend(what: str = "trainer.exact_logprobs") -> None:
    """Refuse, in one line, a process where exact log-probs cannot hold."""
    backend = jax.default_backend()
    if backend != "cpu" or platform.machine().lower() not in ("x86_64", "amd64"):
        raise UsageError(
            f"{what} needs the CPU backend on x86-64 (this process has {backend} on "
            f"{platform.machine()}): other backends contract multiply-adds their own way"
        )
    if not exact_flags_set():
        raise UsageError(
            f"{what} needs XLA_FLAGS={NO_FMA_FLAG} set before JAX starts (rlx sets it for the "
            f"processes it starts; XLA_FLAGS is {os.environ.get('XLA_FLAGS', '')!r})"
        )


def min_rows(hidden_size: int, vocab_size: int) -> int:
    """Fewest rows (positions) of a call in the exact mode for a model of these sizes: at least
    :data:`EXACT_MIN_ROWS`, and enough that a norm over ``hidden_size`` and a log-softmax over
    ``vocab_size`` reduce at least :data:`EXACT_MIN_ELEMENTS` elements."""
    return max(EXACT_MIN_ROWS, -(-EXACT_MIN_ELEMENTS // min(hidden_size, vocab_size)))


def padded_rows(rows: int, per_row: int = 1, *, least: int = EXACT_MIN_ROWS) -> int:
    """Rows a call of ``rows`` rows of ``per_row`` positions is padded to, so that it has at least
    ``least`` positions (:func:`min_rows`)."""
    return max(rows, -(-least // per_row))


def pad_rows(x: jax.Array, rows: int, value=0) -> jax.Array:
    """``x`` with rows of ``value`` appended along axis 0 up to ``rows`` (itself if it has as many)."""
    extra = rows - x.shape[0]
    if extra <= 0:
        return x
    return jnp.pad(x, [(0, extra)] + [(0, 0)] * (x.ndim - 1), constant_values=value)
