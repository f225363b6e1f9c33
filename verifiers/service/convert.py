"""Between library values and the service's protobuf messages (pure).

Every conversion is lossless for what decides an outcome, so that a request judged through the
service gives exactly the ``Outcome`` the library call gives.
"""

from __future__ import annotations

import dataclasses
import json

from verifiers._generated import rlx_verifier_pb2 as pb
from verifiers.code import wire
from verifiers.code.limits import Limits
from verifiers.code.problems import CallTest, CheckScript, CodeProblem, IOTest, Tests
from verifiers.errors import ConfigError
from verifiers.math.config import read_tolerance
from verifiers.math.judge import MathConfig
from verifiers.outcome import Outcome, TestResult, Timings, Verdict

_LIMIT_FIELDS = [f.name for f in dataclasses.fields(Limits)]


def timings_to_proto(t: Timings) -> pb.Timings:
    return pb.Timings(wall_s=t.wall_s)


def timings_from_proto(m: pb.Timings) -> Timings:
    return Timings(wall_s=m.wall_s)


def outcome_to_proto(o: Outcome) -> pb.Outcome:
    return pb.Outcome(
        verdict=o.verdict.value,
        detail=o.detail,
        verifier=o.verifier,
        version=o.version,
        isolation=o.isolation,
        tests=[
            pb.TestResult(index=t.index, verdict=t.verdict.value, detail=t.detail,
                          timings=timings_to_proto(t.timings))
            for t in o.tests
        ],
        timings=timings_to_proto(o.timings),
        passed=o.passed,
        reward=o.reward,
    )


def outcome_from_proto(m: pb.Outcome) -> Outcome:
    return Outcome(
        verdict=Verdict(m.verdict),
        detail=m.detail,
        verifier=m.verifier,
        version=m.version,
        isolation=m.isolation,
        tests=tuple(
            TestResult(t.index, Verdict(t.verdict), t.detail, timings_from_proto(t.timings))
            for t in m.tests
        ),
        timings=timings_from_proto(m.timings),
    )


def math_to_proto(gold: str, response: str, config: MathConfig, timeout_s: float | None) -> pb.MathRequest:
    return pb.MathRequest(
        gold=gold,
        response=response,
        extract=config.extract,
        rel_tol="" if config.rel_tol is None else str(config.rel_tol),
        abs_tol="" if config.abs_tol is None else str(config.abs_tol),
        timeout_s=timeout_s or 0.0,
    )


def math_from_proto(m: pb.MathRequest) -> tuple[str, str, MathConfig, float | None]:
    config = MathConfig(
        extract=m.extract if m.HasField("extract") else True,
        rel_tol=read_tolerance(m.rel_tol or None, "rel_tol"),
        abs_tol=read_tolerance(m.abs_tol or None, "abs_tol"),
    )
    return m.gold, m.response, config, (m.timeout_s or None)


def _json(value) -> str:
    return json.dumps(wire.encode(value), separators=(",", ":"))


def _unjson(text: str, what: str):
    try:
        return wire.decode(json.loads(text)) if text else None
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"call test {what} is not wire-encoded JSON: {e}") from None


def code_to_proto(program: str, problem: CodeProblem) -> pb.CodeRequest:
    limits = pb.Limits(**{name: getattr(problem.limits, name) for name in _LIMIT_FIELDS})
    request = pb.CodeRequest(
        program=program,
        language=problem.language,
        checker=problem.checker,
        limits=limits,
        stop_early=problem.stop_early,
        rel_tol=problem.rel_tol,
        abs_tol=problem.abs_tol,
    )
    tests = problem.tests
    if isinstance(tests, CheckScript):
        request.check.CopyFrom(pb.CheckScript(test=tests.test, entry_point=tests.entry_point, setup=tests.setup))
    elif isinstance(tests[0], CallTest):
        request.calls.CopyFrom(pb.CallTests(tests=[
            pb.CallTest(fn=t.fn, args_json=_json(list(t.args)),
                        kwargs_json=_json([[k, v] for k, v in t.kwargs]),
                        expected_json=_json(t.expected))
            for t in tests
        ]))
    else:
        request.io.CopyFrom(pb.IOTests(tests=[pb.IOTest(input=t.input, output=t.output) for t in tests]))
    return request


def code_from_proto(m: pb.CodeRequest) -> tuple[str, CodeProblem]:
    kind = m.WhichOneof("tests")
    tests: Tests
    if kind == "check":
        tests = CheckScript(test=m.check.test, entry_point=m.check.entry_point, setup=m.check.setup)
    elif kind == "calls":
        tests = tuple(
            CallTest(
                fn=t.fn,
                args=tuple(_unjson(t.args_json, "args") or ()),
                kwargs=tuple((k, v) for k, v in (_unjson(t.kwargs_json, "kwargs") or ())),
                expected=_unjson(t.expected_json, "expected"),
            )
            for t in m.calls.tests
        )
    elif kind == "io":
        tests = tuple(IOTest(t.input, t.output) for t in m.io.tests)
    else:
        raise ConfigError("a code request needs tests: io, calls or check")
    limits = Limits(**{name: getattr(m.limits, name) for name in _LIMIT_FIELDS if m.limits.HasField(name)})
    defaults = CodeProblem(tests=tests)
    problem = CodeProblem(
        tests=tests,
        checker=m.checker or defaults.checker,
        limits=limits,
        language=m.language or defaults.language,
        stop_early=m.stop_early if m.HasField("stop_early") else defaults.stop_early,
        rel_tol=m.rel_tol if m.HasField("rel_tol") else defaults.rel_tol,
        abs_tol=m.abs_tol if m.HasField("abs_tol") else defaults.abs_tol,
    )
    return m.program, problem
