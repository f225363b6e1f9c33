"""The verifier service, for real on loopback: the same outcomes as the library calls."""

from __future__ import annotations

import pytest

from tests.verifiers.code.conftest import _UID_BASE
from verifiers.code import CallTest, CheckScript, CodeProblem, CodeVerifier, IOTest, Limits, Sandbox
from verifiers.errors import ConfigError, ServiceError
from verifiers.math import MathConfig, MathVerifier
from verifiers.outcome import Verdict
from verifiers.service import ServerConfig, VerifierClient, serve


@pytest.fixture(scope="module")
def stack():
    with Sandbox("auto", slots=2, uid_base=_UID_BASE + 70) as sandbox, MathVerifier(workers=1) as math:
        code = CodeVerifier(sandbox)
        server, port = serve(0, host="127.0.0.1", code=code, math=math, threads=4,
                             config=ServerConfig(max_limits=Limits(wall_s=30.0)))
        with VerifierClient([f"127.0.0.1:{port}"], timeout_s=120) as client:
            yield code, math, client, port
        server.stop(0).wait()


CODE_CASES = [
    ("a, b = map(int, input().split())\nprint(a + b)\n", CodeProblem((IOTest("1 2\n", "3\n"), IOTest("2 2\n", "4\n")))),
    ("print(5)\n", CodeProblem((IOTest("1 2\n", "3\n"),), checker="exact")),
    ("import time\ntime.sleep(30)\n", CodeProblem((IOTest("", ""),), limits=Limits(wall_s=1.0))),
    ("def f(x):\n    return (x, [x * 0.5], {'k': None})\n",
     CodeProblem((CallTest("f", (3,), (), (3, [1.5], {"k": None})), CallTest("f", (4,), (), (4, [2.0], {"k": 1}))),
                 stop_early=False)),
    ("def add(a, b):\n    return a + b\n",
     CodeProblem(CheckScript("def check(c):\n    assert c(1, 2) == 3\n", "add"))),
    ("class A:\n    def __eq__(s, o): return True\ndef add(a, b):\n    return A()\n",
     CodeProblem(CheckScript("def check(c):\n    assert c(1, 2) == 3\n", "add"))),
]


@pytest.mark.parametrize("index", range(len(CODE_CASES)))
def test_code_outcomes_are_identical(stack, index):
    code, _, client, _ = stack
    program, problem = CODE_CASES[index]
    remote = client.verify_code(program, problem)
    local = code.verify(program, problem)
    assert remote == local
    assert remote.to_dict()["tests"][0]["verdict"] == local.to_dict()["tests"][0]["verdict"]


@pytest.mark.slow
def test_code_batch_is_identical(stack):
    code, _, client, _ = stack
    remote = client.verify_code_batch(CODE_CASES)
    assert remote == [code.verify(p, q) for p, q in CODE_CASES]
    assert [o.verdict for o in remote] == [Verdict.AC, Verdict.WA, Verdict.TLE, Verdict.WA, Verdict.AC, Verdict.WA]


@pytest.mark.parametrize(
    "gold, response, config",
    [("1/2", r"\boxed{0.5}", MathConfig()), ("1e-7", "2e-7", MathConfig()), ("x+1", "1+x", MathConfig()),
     ("3.14159", "3.1416", MathConfig(rel_tol="1e-4")), ("5", "no answer here", MathConfig()),
     ("5", " 5 ", MathConfig(extract=False))],
)
def test_math_outcomes_are_identical(stack, gold, response, config):
    _, math, client, _ = stack
    assert client.verify_math(gold, response, config) == math.verify(gold, response, config)


def test_math_timeout_through_the_service(stack):
    _, _, client, _ = stack
    outcome = client.verify_math("(x-y-1)^{40}", r"\boxed{(x+y+1)^{40}}", timeout_s=0.5)
    assert outcome.verdict is Verdict.TLE and outcome.detail == "judging took longer than 0.5 s"


def test_health(stack):
    code, _, client, _ = stack
    (health,) = client.health()
    assert health.serving and health.isolation == code.sandbox.level.value and health.slots == 2
    assert health.code_version == "code/2" and health.math_version.startswith("math/2")


def test_bad_requests_are_config_errors(stack):
    _, _, client, _ = stack
    with pytest.raises(ConfigError, match=r"wall_s=60.0 exceeds this server's maximum 30.0"):
        client.verify_code("print(1)", CodeProblem((IOTest("", "1"),), limits=Limits(wall_s=60.0)))


def test_a_dead_host_is_skipped(stack):
    code, _, _, port = stack
    with VerifierClient(["127.0.0.1:1", f"127.0.0.1:{port}"], timeout_s=60) as client:
        for _ in range(2):  # the round-robin starts on each host once
            assert client.verify_code(*CODE_CASES[0]).verdict is Verdict.AC
        assert client.health()[0] is None
    with VerifierClient(["127.0.0.1:1"], timeout_s=5) as client:
        with pytest.raises(ServiceError, match="no verifier host answered"):
            client.verify_math("1", "1")


@pytest.fixture(scope="module")
def strict(stack):
    code, math, _, _ = stack
    config = ServerConfig(
        max_limits=Limits(wall_s=5.0, cpu_s=2.0, memory_bytes=256 << 20, output_bytes=1 << 20),
        max_tests=3, max_program_bytes=100, max_tests_bytes=1000, max_batch=2, max_math_chars=50,
        max_math_timeout_s=5.0,
    )
    server, port = serve(0, host="127.0.0.1", code=code, math=math, threads=2, config=config)
    with VerifierClient(f"127.0.0.1:{port}", timeout_s=60) as client:
        yield client
    server.stop(0).wait()


IO = (IOTest("", "1\n"),)


@pytest.mark.parametrize(
    "program, problem, message",
    [
        ("print(1)", CodeProblem(IO * 4), r"^tests=4 exceeds this server's maximum 3$"),
        ("#" * 101, CodeProblem(IO), r"^program=101 bytes exceeds this server's maximum 100 bytes$"),
        ("print(1)", CodeProblem((IOTest("x" * 1001, ""),)), r"^io size=1001 characters exceeds"),
        ("def f(): pass", CodeProblem(CheckScript("#" * 1001, "f")), r"^check size=1002 characters exceeds"),
        ("print(1)", CodeProblem(IO, limits=Limits(wall_s=6.0, cpu_s=1.0)), r"^limit wall_s=6.0 exceeds"),
        ("print(1)", CodeProblem(IO, limits=Limits(wall_s=1.0, cpu_s=3.0)), r"^limit cpu_s=3.0 exceeds"),
        ("print(1)", CodeProblem(IO, limits=Limits(wall_s=1.0, cpu_s=1.0, memory_bytes=257 << 20)),
         r"^limit memory_bytes=269484032 exceeds this server's maximum 268435456$"),
        ("print(1)", CodeProblem(IO, limits=Limits(wall_s=1.0, cpu_s=1.0, memory_bytes=256 << 20, output_bytes=2 << 20)),
         r"^limit output_bytes=2097152 exceeds"),
    ],
    ids=["tests", "program", "io-size", "check-size", "wall", "cpu", "memory", "output"],
)
def test_requests_over_the_ceilings_are_refused(strict, program, problem, message):
    with pytest.raises(ConfigError, match=message):
        strict.verify_code(program, problem)


@pytest.mark.parametrize(
    "gold, config, timeout_s, message",
    [
        ("1" * 51, MathConfig(), None, r"^gold=51 characters exceeds this server's maximum 50 characters$"),
        ("1", MathConfig(), 6.0, r"^math timeout_s 6.0 must be a number of seconds > 0 and <= 5$"),
        ("1", MathConfig(), float("inf"), r"^math timeout_s inf must be"),
        ("1", MathConfig(), float("nan"), r"^math timeout_s nan must be"),
        ("1", MathConfig(rel_tol="2"), None, r"^rel_tol '2' must be a decimal like 1e-6 or a fraction like 1/1000, from 0 to 1$"),
    ],
)
def test_math_requests_over_the_ceilings_are_refused(strict, gold, config, timeout_s, message):
    with pytest.raises(ConfigError, match=message):
        strict.verify_math(gold, "1", config, timeout_s=timeout_s)


def test_hostile_tolerance_text_is_refused_before_parsing(stack):
    """A tolerance the client did not build from MathConfig (a raw request) is checked as text."""
    from verifiers._generated import rlx_verifier_pb2 as pb

    _, _, client, _ = stack
    for text in ("1e999999", "9" * 5000, "1/0", "nan"):
        with pytest.raises(ConfigError, match="rel_tol .* must be a decimal"):
            client._call("VerifyMath", pb.MathRequest(gold="1", response="1", rel_tol=text))


def test_batches_over_the_ceiling_are_refused(strict):
    with pytest.raises(ConfigError, match="batch of 3 exceeds this server's maximum 2"):
        strict.verify_code_batch([("print(1)", CodeProblem(IO))] * 3)
