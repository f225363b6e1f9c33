"""Hostile programs: each gets the right verdict and leaves nothing behind.

After every run: no process of any sandbox uid survives, nothing was written outside the run,
the harness is unharmed, and a plain program run next on the same slots still passes.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid

import pytest

from tests.verifiers.code.conftest import leftovers
from verifiers.code import CodeProblem, CodeVerifier, IOTest, Limits
from verifiers.outcome import Verdict

# Generous against load (ordinary programs finish in well under a second), bounded for speed.
FAST = Limits(wall_s=2.0, cpu_s=1.0)


def judge(verifier: CodeVerifier, program: str, stdin: str = "", expected: str = "", limits: Limits = FAST):
    problem = CodeProblem(tests=(IOTest(stdin, expected),), limits=limits)
    outcome = verifier.verify(program, problem)
    assert leftovers(verifier.sandbox) == {}
    # the next run on the same slots is unaffected
    follow = verifier.verify("print(sum(map(int, input().split())))", CodeProblem((IOTest("2 3\n", "5\n"),)))
    assert follow.verdict is Verdict.AC, follow.detail
    return outcome


def test_busy_loop_is_tle(verifier):
    outcome = judge(verifier, "while True:\n    pass\n", limits=Limits(wall_s=10.0, cpu_s=1.0))
    assert outcome.verdict is Verdict.TLE
    assert "CPU time limit of 1 s" in outcome.detail


def test_sleep_past_the_limit_is_tle(verifier):
    outcome = judge(verifier, "import time\ntime.sleep(60)\n", limits=Limits(wall_s=1.0))
    assert outcome.verdict is Verdict.TLE
    assert "wall time limit of 1 s" in outcome.detail


def test_memory_bomb_is_mle(verifier):
    outcome = judge(verifier, "x = []\nwhile True:\n    x.append(bytearray(1 << 24))\n",
                    limits=Limits(wall_s=10.0, memory_bytes=256 << 20))
    assert outcome.verdict is Verdict.MLE


def test_fork_bomb_is_tle_and_capped(verifier):
    program = (
        "import os\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        pass\n"
    )
    outcome = judge(verifier, program, limits=Limits(wall_s=2.0, cpu_s=10.0, processes=16))
    assert outcome.verdict is Verdict.TLE


def test_endless_output_is_ole(verifier):
    outcome = judge(verifier, "while True:\n    print('y' * 1000)\n", limits=Limits(output_bytes=1 << 20))
    assert outcome.verdict is Verdict.OLE


def test_endless_stderr_is_ole(verifier):
    outcome = judge(verifier, "import sys\nwhile True:\n    sys.stderr.write('e' * 1000)\n",
                    limits=Limits(output_bytes=1 << 20))
    assert outcome.verdict is Verdict.OLE


def test_reading_a_host_secret_fails(verifier, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the host's secret")
    os.chmod(tmp_path, 0o700)
    os.chmod(secret, 0o600)
    outcome = judge(verifier, f"print(open({str(secret)!r}).read())\n", expected="the host's secret")
    assert outcome.verdict is Verdict.RE
    assert "Error" in outcome.detail or "exit status" in outcome.detail


def test_host_files_are_not_visible_in_namespaces(namespaces_sandbox):
    program = (
        "import os\n"
        "print(sorted(os.listdir('/')))\n"
        "print(os.path.exists('/etc/passwd'), os.path.exists('/root'), os.path.exists('/work/main.py'))\n"
    )
    expected = "['bin', 'dev', 'lib', 'lib64', 'proc', 'sbin', 'tmp', 'usr', 'work']\nFalse False True\n"
    outcome = judge(CodeVerifier(namespaces_sandbox), program, expected=expected)
    assert outcome.verdict is Verdict.AC, outcome.detail


def _write_everywhere(paths: list[str]) -> str:
    return (
        "import os\n"
        f"for p in {paths!r}:\n"
        "    try:\n"
        "        with open(p, 'w') as f:\n"
        "            f.write('x')\n"
        "    except OSError:\n"
        "        pass\n"
        "print('done')\n"
    )


def test_writing_outside_the_work_dir_reaches_nothing(namespaces_sandbox):
    nonce = uuid.uuid4().hex
    paths = [f"/tmp/{nonce}", f"/var/tmp/{nonce}", f"/root/{nonce}", f"/usr/{nonce}",
             f"/dev/shm/{nonce}", f"/work/../{nonce}", f"/etc/{nonce}", f"{os.getcwd()}/{nonce}"]
    outcome = judge(CodeVerifier(namespaces_sandbox), _write_everywhere(paths), expected="done")
    assert outcome.verdict is Verdict.AC
    assert [p for p in paths if os.path.exists(p)] == []


def test_writing_into_host_dirs_fails_in_rlimits(rlimits_sandbox):
    nonce = uuid.uuid4().hex
    paths = [f"/root/{nonce}", f"/usr/{nonce}", f"/etc/{nonce}", f"/var/{nonce}", f"{os.getcwd()}/{nonce}"]
    outcome = judge(CodeVerifier(rlimits_sandbox), _write_everywhere(paths), expected="done")
    assert outcome.verdict is Verdict.AC
    assert [p for p in paths if os.path.exists(p)] == []


@pytest.fixture
def loopback_server():
    """A TCP server on the host's loopback that records every connection it accepts."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    accepted: list[bytes] = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                conn.settimeout(1.0)
                try:
                    accepted.append(conn.recv(100))
                except OSError:
                    accepted.append(b"")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


def test_network_is_blocked_even_to_host_loopback(namespaces_sandbox, loopback_server):
    port, accepted = loopback_server
    program = (
        "import socket\n"
        f"s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        "s.sendall(b'leak')\n"
        "print('connected')\n"
    )
    outcome = judge(CodeVerifier(namespaces_sandbox), program, expected="connected")
    assert outcome.verdict is Verdict.RE
    assert "ConnectionRefusedError" in outcome.detail or "OSError" in outcome.detail
    assert accepted == []
    # and no route out at all
    outcome = judge(CodeVerifier(namespaces_sandbox),
                    "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)\n")
    assert outcome.verdict is Verdict.RE


def test_killing_its_parent_fails_and_the_harness_lives(verifier):
    program = (
        "import os, signal\n"
        "os.kill(os.getppid(), signal.SIGKILL)\n"
        "print('parent killed')\n"
    )
    outcome = judge(verifier, program, expected="parent killed")
    assert outcome.verdict is Verdict.RE
    assert "PermissionError" in outcome.detail


def test_kill_everything_reaches_only_itself(verifier):
    outcome = judge(verifier, "import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('alive')\n", expected="alive")
    assert outcome.verdict in (Verdict.AC, Verdict.RE, Verdict.TLE)  # it may or may not kill itself
    assert os.getpid() > 0  # the harness is alive to assert


def test_daemon_does_not_outlive_the_run(verifier):
    program = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "print('ok')\n"
    )
    outcome = judge(verifier, program, expected="ok")
    assert outcome.verdict is Verdict.AC, outcome.detail
    # judge() asserted that no process of the sandbox uids is left


def test_closing_stdout_then_sleeping_is_tle(verifier):
    outcome = judge(verifier, "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(60)\n", limits=Limits(wall_s=1.0))
    assert outcome.verdict is Verdict.TLE


def test_ignoring_sigterm_is_tle(verifier):
    program = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)\n"
    outcome = judge(verifier, program, limits=Limits(wall_s=1.0))
    assert outcome.verdict is Verdict.TLE


@pytest.mark.slow
def test_ignoring_sigxcpu_is_still_tle(verifier):
    program = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass\n"
    outcome = judge(verifier, program, limits=Limits(wall_s=10.0, cpu_s=1.0))
    assert outcome.verdict is Verdict.TLE


def test_segfault_is_re(verifier):
    outcome = judge(verifier, "import ctypes\nctypes.string_at(0)\n")
    assert outcome.verdict is Verdict.RE
    assert "SIGSEGV" in outcome.detail


def test_huge_file_is_re_and_bounded(verifier):
    program = "with open('big', 'wb') as f:\n    while True:\n        f.write(b'x' * (1 << 20))\n"
    outcome = judge(verifier, program, limits=Limits(file_bytes=4 << 20))
    assert outcome.verdict is Verdict.RE
    # Python ignores SIGXFSZ, so the write past RLIMIT_FSIZE fails with EFBIG instead
    assert "File too large" in outcome.detail


def test_huge_file_kills_a_program_that_keeps_sigxfsz(verifier):
    program = (
        "import signal\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_DFL)\n"
        "with open('big', 'wb') as f:\n"
        "    while True:\n"
        "        f.write(b'x' * (1 << 20))\n"
    )
    outcome = judge(verifier, program, limits=Limits(file_bytes=4 << 20))
    assert outcome.verdict is Verdict.RE
    assert "SIGXFSZ" in outcome.detail


def test_reading_past_the_end_of_input_is_re(verifier):
    outcome = judge(verifier, "a = input()\nb = input()\nprint(a, b)\n", stdin="only one line\n")
    assert outcome.verdict is Verdict.RE
    assert "EOFError" in outcome.detail


def test_state_left_in_tmp_does_not_reach_the_next_run(verifier):
    writer = (
        "import os, tempfile\n"
        "open(os.path.join(tempfile.gettempdir(), 'state'), 'w').write('x')\n"
        "open(os.path.expanduser('~/state'), 'w').write('x')\n"
        "open('state', 'w').write('x')\n"
        "print('written')\n"
    )
    reader = (
        "import os, tempfile\n"
        "paths = [os.path.join(tempfile.gettempdir(), 'state'), os.path.expanduser('~/state'), 'state']\n"
        "print([p for p in paths if os.path.exists(p)])\n"
    )
    assert judge(verifier, writer, expected="written").verdict is Verdict.AC
    for _ in range(verifier.sandbox.slots):  # whichever slot runs next
        assert judge(verifier, reader, expected="[]").verdict is Verdict.AC


def test_private_tmp_is_size_capped(namespaces_sandbox):
    program = (
        "try:\n"
        "    with open('/tmp/fill', 'wb') as f:\n"
        "        for _ in range(64):\n"
        "            f.write(b'x' * (1 << 20))\n"
        "except OSError as e:\n"
        "    print('full', e.errno)\n"
    )
    outcome = judge(CodeVerifier(namespaces_sandbox), program, expected="full 28",
                    limits=Limits(disk_bytes=8 << 20, file_bytes=64 << 20))
    assert outcome.verdict is Verdict.AC, outcome.detail


def test_runs_as_unprivileged_uid_without_capabilities(verifier):
    program = (
        "import os\n"
        "status = open('/proc/self/status').read().splitlines()\n"
        "caps = [l.split()[1] for l in status if l.startswith(('CapEff', 'CapPrm', 'CapBnd'))]\n"
        "nnp = [l.split()[1] for l in status if l.startswith('NoNewPrivs')]\n"
        "print(os.getuid() != 0, os.getgid() != 0, os.getgroups(), caps, nnp)\n"
    )
    expected = "True True [] ['0000000000000000', '0000000000000000', '0000000000000000'] ['1']"
    outcome = judge(verifier, program, expected=expected)
    assert outcome.verdict is Verdict.AC, outcome.detail
