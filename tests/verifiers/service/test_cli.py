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
        (["verify", "math", "--gold", "1", "--answer", "1", "--rel-tol", "abc"], "rel_tol 'abc' is not a number"),
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
