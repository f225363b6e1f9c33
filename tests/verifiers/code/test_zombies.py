"""Thousands of runs leave no zombie behind (finding: every namespaces run that exited by itself
left its ``bwrap`` pid-namespace init as an unreaped zombie of the verifier, until the host ran
out of pids)."""

from __future__ import annotations

import concurrent.futures
import os

import pytest

from verifiers.code import Limits

RUNS = 2000


def zombie_children() -> list[int]:
    """Zombies whose parent is this process (the sandbox's subreaper)."""
    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read().decode("ascii", "replace")
        except OSError:
            continue
        state, ppid = raw[raw.rfind(")") + 2 :].split()[:2]
        if state == "Z" and int(ppid) == me:
            found.append(int(name))
    return found


@pytest.mark.slow
def test_thousands_of_runs_leave_no_zombies(namespaces_sandbox):
    sandbox = namespaces_sandbox
    def one(_: int) -> int | None:
        return sandbox.run(["/usr/bin/true"]).exit_code

    before = set(zombie_children())  # what other tests of this process may have left
    with concurrent.futures.ThreadPoolExecutor(sandbox.slots) as pool:
        futures = [pool.submit(one, i) for i in range(RUNS)]
        try:
            codes = [f.result() for f in futures]
        finally:  # a failed run fails the test now, not after the queued ones
            for f in futures:
                f.cancel()
    assert codes == [0] * RUNS
    assert set(zombie_children()) - before == set()


@pytest.mark.slow
def test_killed_runs_leave_no_zombies(namespaces_sandbox):
    limits = Limits(wall_s=0.3)
    before = set(zombie_children())
    for _ in range(10):
        result = namespaces_sandbox.run(["/usr/bin/sleep", "30"], limits=limits)
        assert result.timed_out and result.killed
    assert set(zombie_children()) - before == set()


def test_a_slot_held_out_of_service_comes_back_once_nothing_of_it_is_left(namespaces_sandbox):
    """A teardown that could not kill everything holds its slot out of service; when no slot is
    free the sandbox sweeps the held ones again instead of waiting forever."""
    sandbox = namespaces_sandbox
    taken = [sandbox._free.get() for _ in range(sandbox.slots)]
    with sandbox._held_lock:
        sandbox._held.update(taken)  # as after unclean teardowns; nothing of these uids is alive
    assert sandbox.run(["/usr/bin/true"]).exit_code == 0
    assert len(sandbox._held) == 0 and sandbox._free.qsize() == sandbox.slots


def test_runs_in_a_process_with_more_than_1024_open_files(namespaces_sandbox):
    """A long-lived verifier holds many descriptors (connections, logs, stores): the sandbox's
    own descriptors are then numbered past 1024, where ``select`` cannot wait on them."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(2048, hard), hard))
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    try:
        assert max(held) > 1024
        assert [namespaces_sandbox.run(["/usr/bin/true"]).exit_code for _ in range(3)] == [0, 0, 0]
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
