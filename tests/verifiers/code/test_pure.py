"""Pure parts of the code verifier: checkers, wire encoding, verdict order, argv, limits."""

from __future__ import annotations

import json
import math
import signal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verifiers.code import checkers, isolation, wire
from verifiers.code.calls import same_value
from verifiers.code.limits import Limits
from verifiers.code.problems import CodeProblem, IOTest, load_io_tests
from verifiers.code.sandbox import RunResult
from verifiers.code.verdict import classify
from verifiers.errors import ConfigError
from verifiers.outcome import Outcome, TestResult, Timings, Verdict


def test_exact_checker():
    assert checkers.exact(b"1 2\r\n3\n\n", b"1 2\n3").ok
    result = checkers.exact(b"1 2\n4\n", b"1 2\n3\n")
    assert not result.ok and result.reason == "output differs at byte 4: got '4', expected '3'"
    assert not checkers.exact(b"1  2", b"1 2").ok


def test_token_checker():
    assert checkers.tokens(b" 1\t2 \n\n3 ", b"1 2 3\n").ok
    assert checkers.tokens(b"1 2", b"1 2 3").reason == "got 2 tokens, expected 3"
    assert checkers.tokens(b"1 5 3", b"1 2 3").reason == "token 1: got '5', expected '2'"


def test_float_checker():
    check = checkers.floats(rel_tol=1e-6, abs_tol=1e-9)
    assert check(b"3.1415926 x", b"3.14159265 x").ok  # |diff| = 5e-8 <= 1e-6 * 3.14
    assert not check(b"3.1416", b"3.14159265").ok  # |diff| = 7.3e-6 > 3.1e-6
    assert check(b"nan", b"nan").ok
    assert not check(b"inf", b"1e308").ok
    with pytest.raises(ConfigError, match="rel_tol=-1"):
        checkers.floats(rel_tol=-1)


def test_unknown_checker_names_the_choices():
    with pytest.raises(ConfigError, match="'fuzzy' is not one of: exact, float, tokens"):
        checkers.get("fuzzy")


plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4)
    | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=5) | st.integers(), inner, max_size=4)
    | st.frozensets(st.integers() | st.text(max_size=3), max_size=4),
    max_leaves=20,
)


@settings(max_examples=40)
@given(plain)
def test_wire_round_trip_keeps_values_and_types(value):
    line = wire.dumps(wire.encode(value))
    back = wire.decode(wire.loads(line))
    assert back == value
    assert type(back) is type(value)
    assert same_value(back, value, 0.0, 0.0) or (isinstance(value, float) and math.isnan(value))


def test_wire_keeps_float_specials_and_refuses_subclasses():
    back = wire.decode(json.loads(json.dumps(wire.encode([float("nan"), float("-inf"), -0.0]))))
    assert math.isnan(back[0]) and back[1] == float("-inf") and math.copysign(1, back[2]) == -1
    assert wire.decode(wire.encode((1, [2], {3: "x"}))) == (1, [2], {3: "x"})

    class Sneaky(int):
        pass

    for bad in (Sneaky(1), object(), [1, Sneaky(2)], {1: object()}):
        with pytest.raises(wire.WireError, match="not plain data"):
            wire.encode(bad)
    for bad in ({"tuple": 1}, {"x": []}, {"float": 1.5}, {"a": 1, "b": 2}):
        with pytest.raises(wire.WireError):
            wire.decode(bad)


def test_same_value_is_strict_about_types():
    assert same_value([1, (2.0, "a")], [1, (2, "a")], 0.0, 0.0)  # numbers compare as numbers
    assert not same_value(True, 1, 0.0, 0.0)
    assert not same_value((1, 2), [1, 2], 0.0, 0.0)
    assert same_value(0.1 + 0.2, 0.3, 1e-9, 0.0)
    assert not same_value(0.1 + 0.2, 0.3, 0.0, 0.0)
    assert same_value(float("nan"), float("nan"), 0.0, 0.0)
    assert not same_value({"a": 1}, {"a": 1, "b": 2}, 0.0, 0.0)


def _run(**kw) -> RunResult:
    base = dict(exit_code=0, signal=None, stdout=b"", stderr=b"", timed_out=False,
                output_exceeded=False, killed=False, wall_s=0.1)
    base.update(kw)
    return RunResult(**base)


def test_verdict_order():
    limits = Limits(wall_s=2, cpu_s=1.5, memory_bytes=64 << 20)
    assert classify(_run(), limits) is None
    # OLE before TLE before MLE before RE
    assert classify(_run(exit_code=None, output_exceeded=True, timed_out=True, killed=True), limits)[0] is Verdict.OLE
    assert classify(_run(exit_code=None, timed_out=True, killed=True), limits) == (Verdict.TLE, "wall time limit of 2 s exceeded")
    assert classify(_run(exit_code=None, signal=signal.SIGXCPU), limits) == (Verdict.TLE, "CPU time limit of 2 s exceeded")
    assert classify(_run(exit_code=None, signal=signal.SIGKILL), limits)[0] is Verdict.TLE  # the CPU hard limit
    assert classify(_run(exit_code=None, signal=signal.SIGKILL, killed=True), limits)[0] is Verdict.RE
    assert classify(_run(exit_code=1, stderr=b"Traceback...\nMemoryError\n"), limits)[0] is Verdict.MLE
    assert classify(_run(exit_code=0, stderr=b"MemoryError"), limits) is None  # a clean exit stays clean
    assert classify(_run(exit_code=3, stderr=b"x\nValueError: bad\n"), limits) == (Verdict.RE, "exit status 3: ValueError: bad")
    assert classify(_run(exit_code=None, signal=signal.SIGSEGV), limits) == (Verdict.RE, "killed by SIGSEGV")
    # the run's cgroup killed something for memory: MLE even if the main process exited 0
    assert classify(_run(memory_exceeded=True), limits)[0] is Verdict.MLE
    assert classify(_run(exit_code=None, signal=signal.SIGKILL, memory_exceeded=True), limits)[0] is Verdict.MLE
    assert classify(_run(exit_code=None, timed_out=True, killed=True, memory_exceeded=True), limits)[0] is Verdict.TLE


def test_namespaces_argv_isolates_everything():
    argv = isolation.namespaces_argv(["/usr/bin/python3", "main.py"], limits=Limits(cpu_s=1.5), uid=61234,
                                     files=[isolation.StagedFile("main.py", 3)])
    for flag in ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--die-with-parent",
                 "--new-session", "--clearenv"):
        assert flag in argv
    assert "--unshare-user" not in argv  # as root it would leave the sandbox uid unmapped
    assert argv[argv.index("--file") + 1 : argv.index("--file") + 3] == ["3", "/work/main.py"]
    assert "--cpu=2:3" in argv and "--reuid=61234" in argv and "--no-new-privs" in argv
    assert argv[-2:] == ["/usr/bin/python3", "main.py"]
    bound = [argv[i + 1] for i, a in enumerate(argv) if a in ("--bind", "--ro-bind")]
    assert bound == ["/usr"]  # nothing of the host but /usr, read-only
    own = isolation.namespaces_argv(["/usr/bin/true"], limits=Limits(), uid=61234, files=(), seccomp_fd=4,
                                    info_fd=3, fs=isolation.RunFs("/run/x/work", "/run/x/tmp"))
    assert own[own.index("--seccomp") + 1] == "4" and own[own.index("--info-fd") + 1] == "3"
    bound = [(own[i + 1], own[i + 2]) for i, a in enumerate(own) if a == "--bind"]
    assert bound == [("/run/x/tmp", "/tmp"), ("/run/x/work", "/work")]  # the run's own tmpfs only
    assert "--tmpfs" not in own


def test_limits_validation_names_the_value():
    with pytest.raises(ConfigError, match=r"wall_s=0 must be"):
        Limits(wall_s=0)
    with pytest.raises(ConfigError, match=r"memory_bytes=100 must be an integer >= 16777216"):
        Limits(memory_bytes=100)
    with pytest.raises(ConfigError, match=r"processes=True"):
        Limits(processes=True)
    assert Limits(cpu_s=1.2).cpu_rlimit == 2
    assert Limits(wall_s=2, cpu_s=1).scaled(3) == Limits(wall_s=6, cpu_s=3)


def test_problem_validation():
    with pytest.raises(ConfigError, match="language 'cobol'"):
        CodeProblem((IOTest("", ""),), language="cobol")
    with pytest.raises(ConfigError, match="at least one test"):
        CodeProblem(())


def test_load_io_tests(tmp_path):
    good = tmp_path / "t.jsonl"
    good.write_text('{"input": "1\\n", "output": "2"}\n\n{"input": "", "output": ""}\n')
    assert load_io_tests(good) == (IOTest("1\n", "2"), IOTest("", ""))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input": "1"}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: expected string fields"):
        load_io_tests(bad)
    bad.write_text("not json\n")
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: not a JSON object"):
        load_io_tests(bad)
    with pytest.raises(ConfigError, match="cannot read tests file"):
        load_io_tests(tmp_path / "missing.jsonl")


def test_outcome_round_trip_and_equality_ignores_timings():
    o = Outcome(Verdict.WA, "test 1: wrong", "code", "code/1", "namespaces",
                (TestResult(0, Verdict.AC, "", Timings(0.1)), TestResult(1, Verdict.WA, "wrong", Timings(0.2))),
                Timings(0.3))
    d = o.to_dict()
    assert list(d)[:3] == ["passed", "verdict", "reward"]
    assert (d["passed"], d["verdict"], d["reward"]) == (False, "WA", 0.0)
    back = Outcome.from_dict(json.loads(json.dumps(d)))
    assert back == o and back.timings == o.timings
    assert Outcome(Verdict.AC, "x", "m", "1", timings=Timings(1.0)) == Outcome(Verdict.AC, "x", "m", "1")
    assert Outcome(Verdict.AC, "x", "m", "1").reward == 1.0
