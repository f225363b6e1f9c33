"""Runs share no kernel state: each channel that carried data between runs, or out of the run's
namespaces, is closed by the sandbox's seccomp filter (findings: keyring across attempts, nested
user namespaces, io_uring).

Every program here prints what the syscall returned, so a test reads the channel's state from
the outside; the same programs succeeded before the filter existed.
"""

from __future__ import annotations

import errno

import pytest

from tests.verifiers.code.conftest import _UID_BASE
from verifiers.code import Sandbox
from verifiers.code.languages import LANGUAGES

_PRELUDE = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
_STORE = _PRELUDE + (
    "key = libc.syscall(248, b'user', b'rlx-answer', b'42', 2, -4)  # add_key to the user keyring\n"
    "print(key, ctypes.get_errno())\n"
)
_FETCH = _PRELUDE + (
    "key = libc.syscall(249, b'user', b'rlx-answer', None, 0)  # request_key\n"
    "buf = ctypes.create_string_buffer(64)\n"
    "n = libc.syscall(250, 11, key, buf, 64)  # keyctl(KEYCTL_READ)\n"
    "print(key, n, buf.raw[:max(n, 0)].decode())\n"
)


def _run(sandbox: Sandbox, source: str) -> str:
    result = sandbox.run(LANGUAGES["python"].run, files={"main.py": source.encode()})
    assert result.exit_code == 0, result
    return result.stdout.decode().strip()


@pytest.fixture(scope="module")
def one_slot():
    """One slot, so that consecutive runs share a uid (and so the uid's own keyring)."""
    with Sandbox("namespaces", slots=1, uid_base=_UID_BASE + 30) as sandbox:
        yield sandbox


def test_a_key_stored_by_one_run_is_not_readable_by_the_next(one_slot):
    stored = _run(one_slot, _STORE)
    assert stored == f"-1 {errno.EPERM}"  # add_key denied (it returned a key id before)
    fetched = _run(one_slot, _FETCH)
    assert "42" not in fetched
    assert fetched.split()[0] == "-1"


def test_x32_syscall_numbers_do_not_reach_the_keyring(one_slot):
    # The x32 ABI numbers (bit 30 set) must not slip past a filter written for x86_64.
    program = _PRELUDE + "print(libc.syscall(0x40000000 | 248, b'user', b'k', b'v', 1, -4))\n"
    result = one_slot.run(LANGUAGES["python"].run, files={"main.py": program.encode()})
    # killed by the filter (SIGSYS), or refused by the kernel: never a key id
    assert result.signal is not None or int(result.stdout) < 0, result


def test_a_run_cannot_create_a_user_namespace(one_slot):
    program = _PRELUDE + (
        "print(libc.unshare(0x10000000), ctypes.get_errno())  # CLONE_NEWUSER\n"
        "import os\n"
        "print(libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0))  # clone(CLONE_NEWUSER | SIGCHLD)\n"
    )
    lines = _run(one_slot, program).splitlines()
    assert lines[0] == f"-1 {errno.EPERM}"
    assert lines[1] == "-1"


def test_a_run_cannot_set_up_io_uring(one_slot):
    program = _PRELUDE + (
        "params = ctypes.create_string_buffer(120)\n"
        "print(libc.syscall(425, 8, params), ctypes.get_errno())  # io_uring_setup\n"
    )
    assert _run(one_slot, program) == f"-1 {errno.EPERM}"


@pytest.mark.parametrize("name, number", [("bpf", 321), ("perf_event_open", 298), ("userfaultfd", 323),
                                          ("ptrace", 101), ("mount", 165), ("setns", 308)])
def test_other_cross_run_syscalls_are_denied(one_slot, name, number):
    program = _PRELUDE + f"print(libc.syscall({number}, 0, 0, 0, 0, 0), ctypes.get_errno())\n"
    assert _run(one_slot, program) == f"-1 {errno.EPERM}", name


def test_ordinary_programs_still_fork_and_use_threads(one_slot):
    program = (
        "import os, subprocess, threading\n"
        "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
        "print(subprocess.run(['/bin/echo', 'child'], capture_output=True).stdout.decode().strip())\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(7)\n"
        "print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
    )
    assert _run(one_slot, program).splitlines() == ["thread", "child", "7"]
