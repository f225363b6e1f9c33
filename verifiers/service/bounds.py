"""Ceilings on what one request (or one command line) may ask of a verifier (pure).

A verifier host runs other people's programs; every size, count and time in a request is checked
against this host's ``ServerConfig`` before any work starts, and a request over a ceiling is
refused with a message naming the field. The same checks of times and tolerances serve the
``rlx verify`` command line, so both refuse the same hostile values.
"""

from __future__ import annotations

import dataclasses
import fractions
import math

from verifiers._generated import rlx_verifier_pb2 as pb
from verifiers.code.limits import MIB, Limits
from verifiers.errors import ConfigError
from verifiers.math.config import MAX_TOLERANCE, read_tolerance

MAX_SECONDS = 86_400.0  # a day: longer is a typo, and past ~24 days the OS timers overflow
MAX_REL_TOL = fractions.Fraction(1)
MAX_ABS_TOL = fractions.Fraction(MAX_TOLERANCE)  # the math judge's own ceiling


def seconds(value: float, name: str, maximum: float = MAX_SECONDS) -> float:
    """``value`` if it is a finite number of seconds in (0, maximum], else a ``ConfigError``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= maximum:
        raise ConfigError(f"{name} {value!r} must be a number of seconds > 0 and <= {maximum:g}")
    return float(value)


def tolerance(text: str | None, name: str, maximum: fractions.Fraction) -> str | None:
    """``text`` if it is a tolerance the math judge can use (``verifiers.math.read_tolerance``'s
    bounded grammar, so no huge number is ever built) from 0 to ``maximum`` (``MAX_REL_TOL``,
    ``MAX_ABS_TOL``)."""
    if text is None:
        return None
    try:
        value = read_tolerance(text, name)
    except ConfigError:
        value = None
    if value is None or value > maximum:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise ConfigError(
            f"{name} {shown!r} must be a decimal like 1e-6 or a fraction like 1/1000, from 0 to {float(maximum):g}"
        )
    return text


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """Ceilings a verifier host puts on requests (``rlx serve verifier --max-...``).

    Attributes:
      max_limits: no limit in a code request may exceed these.
      max_tests: IO or call tests in one code request.
      max_program_bytes: source of one program (UTF-8 bytes).
      max_tests_bytes: IO test text, call-test JSON or check-script code of one request.
      max_batch: code requests in one batch.
      max_math_chars: characters of a math reference or response.
      max_math_timeout_s: the longest math judging a request may ask for.
      max_message_bytes: the largest gRPC message received or sent.
    """

    max_limits: Limits = Limits(
        wall_s=120.0, cpu_s=60.0, memory_bytes=4 << 30, output_bytes=64 * MIB,
        processes=256, file_bytes=256 * MIB, open_files=1024, disk_bytes=1 << 30,
    )
    max_tests: int = 10_000
    max_program_bytes: int = 1 * MIB
    max_tests_bytes: int = 32 * MIB
    max_batch: int = 1024
    max_math_chars: int = 100_000
    max_math_timeout_s: float = 60.0
    max_message_bytes: int = 64 * MIB

    def __post_init__(self) -> None:
        seconds(self.max_math_timeout_s, "max_math_timeout_s")
        for name in ("max_tests", "max_program_bytes", "max_tests_bytes", "max_batch", "max_math_chars",
                     "max_message_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 31:
                raise ConfigError(f"{name} {value!r} must be an integer from 1 to {1 << 31}")


def _over(name: str, value, cap, unit: str = "") -> ConfigError:
    return ConfigError(f"{name}={value!r}{unit} exceeds this server's maximum {cap!r}{unit}")


def check_limits(limits: Limits, config: ServerConfig) -> None:
    """Every limit of a code request within the server's ceilings."""
    for field in dataclasses.fields(Limits):
        value, cap = getattr(limits, field.name), getattr(config.max_limits, field.name)
        if value > cap:
            raise _over(f"limit {field.name}", value, cap)


def check_code_request(m: pb.CodeRequest, config: ServerConfig) -> None:
    """Sizes and counts of one code request, checked before anything is decoded or run."""
    program = len(m.program.encode("utf-8", "surrogatepass"))
    if program > config.max_program_bytes:
        raise _over("program", program, config.max_program_bytes, " bytes")
    kind = m.WhichOneof("tests")
    if kind == "io":
        count = len(m.io.tests)
        size = sum(len(t.input) + len(t.output) for t in m.io.tests)
    elif kind == "calls":
        count = len(m.calls.tests)
        size = sum(len(t.fn) + len(t.args_json) + len(t.kwargs_json) + len(t.expected_json) for t in m.calls.tests)
    else:
        count = 1
        size = len(m.check.test) + len(m.check.setup) + len(m.check.entry_point)
    if count > config.max_tests:
        raise _over("tests", count, config.max_tests)
    if size > config.max_tests_bytes:
        raise _over(f"{kind or 'tests'} size", size, config.max_tests_bytes, " characters")


def check_math_request(m: pb.MathRequest, config: ServerConfig) -> None:
    """Sizes, time and tolerances of one math request."""
    for name in ("gold", "response"):
        size = len(getattr(m, name))
        if size > config.max_math_chars:
            raise _over(name, size, config.max_math_chars, " characters")
    if m.timeout_s != 0.0:
        seconds(m.timeout_s, "math timeout_s", config.max_math_timeout_s)
    tolerance(m.rel_tol or None, "rel_tol", MAX_REL_TOL)
    tolerance(m.abs_tol or None, "abs_tol", MAX_ABS_TOL)
