"""Judge programs against code problems: compile, run each test in the sandbox, check outside.

``CodeVerifier.verify`` runs one program's tests in order and stops at the first failure (when
the problem says so); ``verify_batch`` judges many programs at once on a bounded thread pool, one
sandbox slot per live run. Every result is an ``Outcome``; only a broken setup raises.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import pathlib
import threading
from collections.abc import Sequence
from typing import cast

from verifiers.code import checkers, languages, verdict
from verifiers.code.calls import CallSession, SolutionFailed, failure_verdict, same_value
from verifiers.code.check_script import judge_check_script
from verifiers.code.isolation import Isolation
from verifiers.code.limits import MIB, Limits
from verifiers.code.problems import CallTest, CheckScript, CodeProblem, IOTest
from verifiers.code.sandbox import RunResult, Sandbox
from verifiers.outcome import Outcome, TestResult, Timings, Verdict

VERSION = "code/2"  # 2: check scripts run sandboxed and must call and assert
COMPILE_TIME_FACTOR = 3.0
_HERE = pathlib.Path(__file__).resolve().parent


@functools.cache
def driver_files() -> dict[str, bytes]:
    """The call harness's files, as a sandboxed run of ``call_driver.py`` needs them."""
    return {name: (_HERE / name).read_bytes() for name in ("call_driver.py", "wire.py")}


def _timings(run: RunResult) -> Timings:
    return Timings(wall_s=run.wall_s)


def _compile_limits(limits: Limits) -> Limits:
    return dataclasses.replace(
        limits.scaled(COMPILE_TIME_FACTOR),
        output_bytes=max(limits.output_bytes, 64 * MIB),
        memory_bytes=max(limits.memory_bytes, 1024 * MIB),
        processes=max(limits.processes, 16),
        file_bytes=max(limits.file_bytes, 64 * MIB),
        disk_bytes=max(limits.disk_bytes, 256 * MIB),
    )


class CodeVerifier:
    """Judges programs in a ``Sandbox``; safe to use from many threads.

    Args:
      sandbox: the sandbox to run in; by default a new one with ``isolation``, ``slots`` and
        ``allow_weak`` (see ``Sandbox``).
    """

    def __init__(
        self,
        sandbox: Sandbox | None = None,
        *,
        isolation: Isolation | str = Isolation.AUTO,
        slots: int = 4,
        allow_weak: bool = False,
    ):
        if sandbox is None:
            sandbox = Sandbox(isolation, slots=slots, allow_weak=allow_weak)
        self.sandbox = sandbox

    def verify(self, program: str, problem: CodeProblem) -> Outcome:
        """Judge ``program`` (source text) on every test of ``problem``."""
        lang = languages.get(problem.language)
        source = program.encode("utf-8", "surrogateescape")
        build = Timings()
        if lang.compile:
            built = self.sandbox.run(
                lang.compile, files={lang.source: source}, limits=_compile_limits(problem.limits)
            )
            build = _timings(built)
            failed = verdict.classify(built, _compile_limits(problem.limits))
            if failed is not None or not built.stdout:
                reason = verdict.first_error(built) or (failed[1] if failed else "no artifact")
                return self._outcome([TestResult(0, Verdict.CE, f"compile failed: {reason}", build)])
            files = {lang.artifact: built.stdout}
        else:
            files = {lang.source: source}
        if isinstance(problem.tests, CheckScript):
            results = [self._check_script(source, problem)]
        elif isinstance(problem.tests[0], CallTest):
            results = self._call_tests(source, problem)
        else:
            results = self._io_tests(lang, files, problem)
        if build.wall_s:
            results[0] = dataclasses.replace(results[0], timings=results[0].timings + build)
        return self._outcome(results)

    def verify_batch(self, items: Sequence[tuple[str, CodeProblem]]) -> list[Outcome]:
        """Judge many (program, problem) pairs concurrently, at most one run per sandbox slot."""
        with concurrent.futures.ThreadPoolExecutor(self.sandbox.slots) as pool:
            return list(pool.map(lambda item: self.verify(*item), items))

    def _outcome(self, results: list[TestResult]) -> Outcome:
        total = Timings()
        for r in results:
            total = total + r.timings
        failed = next((r for r in results if not r.passed), None)
        if failed is None:
            verdict_, detail = Verdict.AC, f"all {len(results)} tests passed"
        else:
            verdict_, detail = failed.verdict, f"test {failed.index}: {failed.detail}"
        return Outcome(
            verdict=verdict_,
            detail=detail,
            verifier="code",
            version=VERSION,
            isolation=self.sandbox.level.value,
            tests=tuple(results),
            timings=total,
        )

    def _io_tests(self, lang, files, problem: CodeProblem) -> list[TestResult]:
        check = checkers.get(problem.checker)
        results = []
        tests = cast(tuple[IOTest, ...], problem.tests)  # ``verify`` sends IO tests here
        for index, test in enumerate(tests):
            run = self.sandbox.run(
                lang.run,
                files=files,
                stdin=test.input.encode(),
                limits=problem.limits,
                executable=(lang.artifact,) if lang.artifact else (),
            )
            decided = verdict.classify(run, problem.limits)
            if decided is None:
                result = check(run.stdout, test.output.encode())
                decided = (Verdict.AC, "") if result.ok else (Verdict.WA, result.reason)
            results.append(TestResult(index, decided[0], decided[1], _timings(run)))
            if decided[0] is not Verdict.AC and problem.stop_early:
                break
        return results

    def _start_calls(self, source: bytes, problem: CodeProblem):
        files = {"solution.py": source, **driver_files()}
        argv = languages.PYTHON_ARGV + ("call_driver.py",)
        return self.sandbox.start(argv, files=files, limits=problem.limits)

    def _call_tests(self, source: bytes, problem: CodeProblem) -> list[TestResult]:
        results: list[TestResult] = []
        with self._start_calls(source, problem) as live:
            try:
                session = CallSession(live)
                tests = cast(tuple[CallTest, ...], problem.tests)  # ``verify`` sends call tests here
                for index, test in enumerate(tests):
                    actual = session.call(test.fn, test.args, dict(test.kwargs))
                    if same_value(actual, test.expected, problem.rel_tol, problem.abs_tol):
                        results.append(TestResult(index, Verdict.AC))
                        continue
                    shown = repr(actual)
                    shown = shown if len(shown) <= 80 else shown[:77] + "..."
                    results.append(TestResult(index, Verdict.WA, f"{test.fn} returned {shown}"))
                    if problem.stop_early:
                        break
            except SolutionFailed as failure:
                verdict_, detail = failure_verdict(live, failure, problem.limits)
                results.append(TestResult(len(results), verdict_, detail))
            run = live.result()
        timed = _timings(run)
        results[-1] = dataclasses.replace(results[-1], timings=timed)
        return results

    def _check_script(self, source: bytes, problem: CodeProblem) -> TestResult:
        return judge_check_script(self.sandbox, problem, lambda: self._start_calls(source, problem))


_default: CodeVerifier | None = None
_default_lock = threading.Lock()


def default_verifier() -> CodeVerifier:
    """The process-wide ``CodeVerifier`` behind ``verify_code`` (auto isolation, 4 slots)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = CodeVerifier()
        return _default


def verify_code(program: str, problem: CodeProblem) -> Outcome:
    """Judge ``program`` on ``problem`` with the process-wide verifier."""
    return default_verifier().verify(program, problem)
