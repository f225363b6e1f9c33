"""The Python tool runs the model's code in the code verifier's sandbox: hostile code is cut by
its limits, the result says which, and nothing of it is left behind."""

from __future__ import annotations

import pytest

from runtime.episodes import MAX_RESULT_BYTES, PythonTool, Status
from verifiers.code import Limits, processes

# Small limits keep each hostile run short; ordinary code finishes far below them.
FAST = Limits(wall_s=3.0, cpu_s=1.0, output_bytes=1 << 20, processes=16, file_bytes=4 << 20)


@pytest.fixture
def tool(sandbox):
    yield PythonTool(sandbox, FAST)
    assert {uid: pids for uid in sandbox.uids if (pids := processes.processes_of(uid))} == {}


def test_prints_and_exits_zero(tool):
    result = tool.run("print(12 * 7)\n")
    assert (result.status, result.output, result.exit_status, result.truncated) == (Status.OK, b"84\n", 0, False)
    assert 0 < result.wall_s < FAST.wall_s
    assert result.text() == "84\n"


def test_an_exception_is_an_error_with_its_traceback(tool):
    result = tool.run("print('before')\n1/0\n")
    assert result.status is Status.ERROR and result.exit_status == 1
    assert result.output.startswith(b"before\n") and b"ZeroDivisionError" in result.output
    assert "ZeroDivisionError" in result.detail


def test_an_endless_loop_is_cut_by_the_time_limit(tool):
    result = tool.run("while True:\n    pass\n")
    assert result.status is Status.TIME_LIMIT and result.exit_status is None
    assert "CPU time limit of 1 s" in result.detail


def test_sleeping_is_cut_by_the_wall_limit(tool):
    result = tool.run("import time\ntime.sleep(60)\n")
    assert result.status is Status.TIME_LIMIT and "wall time limit of 3 s" in result.detail


def test_a_fork_bomb_is_cut_and_leaves_nothing(tool):
    result = tool.run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")
    assert result.status is Status.TIME_LIMIT, result
    assert result.exit_status is None


def test_writing_a_gigabyte_is_cut_by_the_file_size_limit(tool):
    program = "with open('big', 'wb') as f:\n    for _ in range(1024):\n        f.write(b'0' * (1 << 20))\n"
    result = tool.run(program)
    # Python ignores SIGXFSZ, so the write past RLIMIT_FSIZE fails with EFBIG
    assert result.status is Status.ERROR and result.exit_status == 1
    assert "File too large" in result.detail


def test_printing_100_mb_is_cut_by_the_output_limit(tool):
    result = tool.run("import sys\nfor _ in range(100):\n    sys.stdout.write('x' * (1 << 20))\n")
    assert result.status is Status.OUTPUT_LIMIT and result.exit_status is None
    assert f"output exceeded {1 << 20} bytes" in result.detail
    assert result.truncated and result.output == b"x" * MAX_RESULT_BYTES
    assert result.text().endswith("...(output truncated)\nerror: " + result.detail)


def test_a_memory_bomb_is_cut_by_the_memory_limit(sandbox):
    result = PythonTool(sandbox, Limits(wall_s=5.0, memory_bytes=64 << 20)).run(
        "x = []\nwhile True:\n    x.append(bytearray(1 << 24))\n")
    assert result.status is Status.MEMORY_LIMIT and result.exit_status is None


def test_too_much_code_is_refused_before_running(tool):
    result = tool.run("#" * (70 * 1024))
    assert result.status is Status.ERROR and "code longer than" in result.detail and result.wall_s == 0.0
