"""Sandboxed code execution, output checkers and the function-call harness."""

from verifiers.code.checkers import CHECKERS, Check
from verifiers.code.isolation import Isolation
from verifiers.code.languages import LANGUAGES, Language
from verifiers.code.limits import Limits
from verifiers.code.problems import CallTest, CheckScript, CodeProblem, IOTest, load_io_tests
from verifiers.code.sandbox import RunResult, Sandbox, WeakIsolationRefused
from verifiers.code.verify import CodeVerifier, verify_code

__all__ = [
    "CHECKERS",
    "CallTest",
    "Check",
    "CheckScript",
    "CodeProblem",
    "CodeVerifier",
    "IOTest",
    "Isolation",
    "LANGUAGES",
    "Language",
    "Limits",
    "RunResult",
    "Sandbox",
    "WeakIsolationRefused",
    "load_io_tests",
    "verify_code",
]
