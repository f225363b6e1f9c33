"""``rlx verify math|code`` and ``rlx serve verifier`` from the command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from runtime.cli import main
from verifiers.service import VerifierClient


def test_verify_math_json(capsys):
    assert main(["verify", "math", "--gold", "1/2", "--answer", r"so \boxed{0.5}", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["passed"], out["verdict"], out["reward"]) == (True, "AC", 1.0)


def test_verify_math_wrong_answer_exits_1(capsys):
    assert main(["verify", "math", "--gold", "1e-7", "--answer", "2e-7"]) == 1
    assert capsys.readouterr().out.startswith("WA reward=0: ")


def test_verify_code(tmp_path, capsys):
    program = tmp_path / "p.py"
    program.write_text("a, b = map(int, input().split())\nprint(a + b)\n")
    tests = tmp_path / "t.jsonl"
    tests.write_text('{"input": "1 2\\n", "output": "3\\n"}\n{"input": "5 5\\n", "output": "11\\n"}\n')
    assert main(["verify", "code", "--program", str(program), "--tests", str(tests), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert (out["passed"], out["verdict"], out["reward"]) == (False, "WA", 0.0)
    assert [t["verdict"] for t in out["tests"]] == ["AC", "WA"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["verify", "code", "--program", "/nonexistent.py", "--tests", "/dev/null"], "cannot read program '/nonexistent.py'"),
        (["verify", "math", "--gold", "1", "--answer", "1", "--rel-tol", "abc"], "--rel-tol 'abc' must be a decimal like 1e-6"),
        (["verify", "code", "--program", __file__, "--tests", "TESTS", "--isolation", "chroot"], "isolation 'chroot' is not one of"),
        (["verify", "code", "--program", __file__, "--tests", "TESTS", "--checker", "fuzzy"], "checker 'fuzzy' is not one of"),
    ],
)
def test_user_errors_are_one_line(argv, message, capsys, tmp_path):
    tests = tmp_path / "t.jsonl"
    tests.write_text('{"input": "", "output": ""}\n')
    argv = [str(tests) if a == "TESTS" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlx: error: ") and message in err and err.count("\n") == 1


def test_serve_verifier_answers_on_loopback():
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "serve", "verifier", "--port", "0", "--host", "127.0.0.1",
         "--slots", "1", "--math-workers", "1"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        banner = json.loads(proc.stdout.readline())
        assert banner["service"] == "verifier" and banner["port"] > 0
        with VerifierClient(f"127.0.0.1:{banner['port']}", timeout_s=120) as client:
            assert client.verify_math("2", r"\boxed{2}").passed
            assert client.health()[0].serving
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()


def _one_line_error(argv, capsys) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing was judged or served
    assert captured.err.startswith("rlx: error: ") and captured.err.count("\n") == 1, captured.err
    return captured.err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--time-limit", "inf"], "--time-limit inf must be a number of seconds > 0 and <= 3600"),
        (["--time-limit", "1e300"], "--time-limit 1e+300 must be a number of seconds > 0 and <= 3600"),
        (["--time-limit", "1e9"], "--time-limit 1000000000.0 must be a number of seconds"),
        (["--time-limit", "nan"], "--time-limit nan must be"),
        (["--time-limit", "0"], "--time-limit 0.0 must be"),
        (["--cpu-limit", "1e300"], "--cpu-limit 1e+300 must be"),
        (["--cpu-limit", "-1"], "--cpu-limit -1.0 must be"),
        (["--memory-mb", "100000000000000000000"], "--memory-mb 100000000000000000000 must be an integer from 16 to 1048576"),
        (["--memory-mb", "10000000000000"], "--memory-mb 10000000000000 must be an integer from 16"),
        (["--memory-mb", "1"], "--memory-mb 1 must be an integer from 16 to 1048576"),
        (["--program", "/dev/zero"], "program '/dev/zero' is larger than 16777216 bytes"),
        (["--tests", "/dev/zero"], "tests file '/dev/zero' is larger than 67108864 bytes"),
        (["--program", "BINARY"], "is not UTF-8 text"),
        (["--tests", "BINARY"], "is not UTF-8 text"),
        (["--program", "/"], "cannot read program '/': Is a directory"),
        (["--tests", "DEEP"], "deep.jsonl:1: not a JSON object"),
        (["--tests", "SURROGATE"], "surrogate.jsonl:1: a test holds an escape that is not a character"),
    ],
)
def test_hostile_verify_code_options(extra, message, tmp_path, capsys):
    program = tmp_path / "p.py"
    program.write_text("print(int(input()) + 1)\n")
    tests = tmp_path / "t.jsonl"
    tests.write_text('{"input": "1\\n", "output": "2\\n"}\n')
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00")
    argv = ["verify", "code", "--program", str(program), "--tests", str(tests), *extra]
    (tmp_path / "deep.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    (tmp_path / "surrogate.jsonl").write_text('{"input": "\\ud800", "output": ""}\n')
    named = {"BINARY": binary, "DEEP": tmp_path / "deep.jsonl", "SURROGATE": tmp_path / "surrogate.jsonl"}
    argv = [str(named[a]) if a in named else a for a in argv]
    # a later --program/--tests wins in argparse, so each case overrides one option
    assert message in _one_line_error(argv, capsys)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--timeout", "inf"], "--timeout inf must be a number of seconds > 0 and <= 3600"),
        (["--timeout", "1e300"], "--timeout 1e+300 must be"),
        (["--rel-tol", "1e999999"], "--rel-tol '1e999999' must be a decimal like 1e-6"),
        (["--abs-tol", "1e999999"], "--abs-tol '1e999999' must be a decimal like 1e-6"),
        (["--rel-tol", "2"], "from 0 to 1"),
        (["--abs-tol", "9" * 5000], "--abs-tol '9999999999999999999999999999999999999999...' must be"),
    ],
)
def test_hostile_verify_math_options(extra, message, capsys):
    assert message in _one_line_error(["verify", "math", "--gold", "1", "--answer", "1", *extra], capsys)


def _lock_files() -> set[str]:
    import os

    try:
        return set(os.listdir("/run/rlx-sandbox-uids"))
    except OSError:
        return set()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--host", "0.0.0.0"], "listening on 0.0.0.0 (not loopback) needs a token: set $RLX_TOKEN or pass --token-file"),
        (["--host", "::"], "listening on :: (not loopback) needs a token"),
        (["--host", ""], "host '' is neither an IP address nor a host name"),
        (["--host", "127.0.0.1:5"], "host '127.0.0.1:5' is neither"),
        (["--port", "70000"], "port 70000 must be an integer in 0..65535"),
        (["--slots", "100000"], "--slots 100000 must be an integer from 1 to 256"),
        (["--slots", "0"], "--slots 0 must be an integer from 1 to 256"),
        (["--threads", "100000000"], "--threads 100000000 must be an integer from 1 to 1024"),
        (["--math-workers", "100000"], "--math-workers 100000 must be an integer from 1 to 64"),
        (["--max-wall-s", "inf"], "--max-wall-s inf must be a number of seconds"),
        (["--max-memory-mb", "0"], "--max-memory-mb 0 must be an integer from 16"),
        (["--max-tests", "0"], "--max-tests 0 must be an integer from 1"),
        (["--token-file", "/dev/zero"], "token file '/dev/zero' is larger than 4096 bytes"),
        (["--token-file", "/nonexistent"], "cannot read token file '/nonexistent'"),
        (["--tls-cert", "/etc/hostname"], "TLS needs both --tls-cert and --tls-key"),
        (["--tls-cert", "/etc/hostname", "--tls-key", "/etc/hostname"], "the TLS key file is not PEM"),
        (["--isolation", "chroot"], "isolation 'chroot' is not one of"),
    ],
)
def test_hostile_serve_options(extra, message, capsys, monkeypatch):
    monkeypatch.delenv("RLX_TOKEN", raising=False)
    before = _lock_files()
    err = _one_line_error(["serve", "verifier", "--port", "0", *extra], capsys)
    assert message in err
    assert _lock_files() <= before  # no sandbox uid was claimed


@pytest.mark.parametrize("host", ["127.0.0.1", "999.1.1.1"])
def test_serve_on_a_busy_port_or_foreign_address(host, capsys, monkeypatch):
    import socket

    monkeypatch.setenv("RLX_TOKEN", "a-token-of-enough-length")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        err = _one_line_error(["serve", "verifier", "--port", str(port), "--host", host, "--slots", "1"], capsys)
    assert f"rlx: error: cannot listen on {host}:{port}: the port is in use or the address is not this host's" in err


def _serve(*argv: str, env: dict | None = None) -> tuple[subprocess.Popen, dict]:
    import os

    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "serve", "verifier", "--port", "0", "--slots", "1",
         "--math-workers", "1", *argv],
        stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
    )
    return proc, json.loads(proc.stdout.readline())


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=30)
    proc.stdout.close()


def test_serve_listens_on_loopback_by_default():
    proc, banner = _serve()
    try:
        assert (banner["host"], banner["token"], banner["tls"]) == ("127.0.0.1", False, False)
    finally:
        _stop(proc)


def test_serve_on_all_interfaces_checks_the_token():
    from verifiers.errors import ServiceError

    token = "cli-token-0123456789abcdef"
    proc, banner = _serve("--host", "0.0.0.0", env={"RLX_TOKEN": token})
    try:
        assert (banner["host"], banner["token"]) == ("0.0.0.0", True)
        with VerifierClient(f"127.0.0.1:{banner['port']}", timeout_s=60) as client:
            with pytest.raises(ServiceError, match="UNAUTHENTICATED"):
                client.verify_math("2", r"\boxed{2}")
        with VerifierClient(f"127.0.0.1:{banner['port']}", timeout_s=60, token=token) as client:
            assert client.verify_math("2", r"\boxed{2}").passed
    finally:
        _stop(proc)
