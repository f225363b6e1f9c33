"""Math answer verification: extraction, claims, exact comparison, math-verify, bounded work and time."""

from verifiers.math.exact import parse_constant
from verifiers.math.extract import Extracted, extract_answer, extract_gold, normalize
from verifiers.math.judge import MathConfig, judge_bounded, judge_math
from verifiers.math.pool import MathVerifier, verify_math

__all__ = [
    "Extracted",
    "MathConfig",
    "MathVerifier",
    "extract_answer",
    "extract_gold",
    "judge_bounded",
    "judge_math",
    "normalize",
    "parse_constant",
    "verify_math",
]
