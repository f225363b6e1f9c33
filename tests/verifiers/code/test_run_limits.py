"""Limits bind a run as a whole, not each of its processes (finding: three processes held
1.2 GiB under a 512 MiB limit and passed; 300,000 empty files in the tmpfs took kernel memory
that nothing capped)."""

from __future__ import annotations

import os

import pytest

from tests.verifiers.code.conftest import leftovers
from verifiers.code import CodeProblem, IOTest, Limits, Sandbox, mounts
from verifiers.code.languages import LANGUAGES
from verifiers.outcome import Verdict

MIB = 1 << 20

# Each of three processes holds 400 MiB (touched, so it is resident) well under its own
# address-space limit, then the parent prints the answer whatever happened to its children.
_THREE_HOLDERS = """
import os, time
children = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        block = b"x" * (400 << 20)
        time.sleep(1.0)
        os._exit(0)
    children.append(pid)
block = b"x" * (400 << 20)
time.sleep(1.0)
for pid in children:
    os.waitpid(pid, 0)
print(42)
"""


def test_three_processes_over_the_run_memory_limit_are_mle(verifier):
    limits = Limits(wall_s=20.0, cpu_s=10.0, memory_bytes=512 * MIB)
    outcome = verifier.verify(_THREE_HOLDERS, CodeProblem((IOTest("", "42\n"),), limits=limits))
    assert outcome.verdict is Verdict.MLE, outcome.detail
    assert leftovers(verifier.sandbox) == {}


def test_one_process_under_the_run_memory_limit_passes(verifier):
    program = "block = b'x' * (100 << 20)\nprint(len(block) >> 20)\n"
    limits = Limits(wall_s=20.0, memory_bytes=512 * MIB)
    outcome = verifier.verify(program, CodeProblem((IOTest("", "100\n"),), limits=limits))
    assert outcome.verdict is Verdict.AC, outcome.detail


_MANY_FILES = """
import os, sys
where = os.environ["TMPDIR"] if sys.argv[1] == "tmp" else sys.argv[1]
made = 0
try:
    while made < 200_000:
        open(os.path.join(where, "f%d" % made), "w").close()
        made += 1
except OSError as e:
    print(made, e.errno)
else:
    print(made, 0)
"""


@pytest.mark.parametrize("where", ["tmp", "."])  # the run's own /tmp (TMPDIR), its work dir
def test_mass_file_creation_is_capped(sandbox, where):
    limits = Limits(wall_s=60.0, cpu_s=30.0)
    argv = LANGUAGES["python"].run + (where,)
    result = sandbox.run(argv, files={"main.py": _MANY_FILES.encode()}, limits=limits)
    assert result.exit_code == 0, result
    made, err = map(int, result.stdout.split())
    assert err == 28  # ENOSPC: the file system is full, not the host's memory
    assert made <= limits.inodes
    assert leftovers(sandbox) == {}


def test_a_fork_bomb_is_capped_per_run(sandbox):
    program = """
import os, time
made = 0
for _ in range(500):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    made += 1
print(made)
"""
    limits = Limits(wall_s=20.0, cpu_s=10.0, processes=12)
    result = sandbox.run(LANGUAGES["python"].run, files={"main.py": program.encode()}, limits=limits)
    assert result.exit_code == 0, result
    assert 0 < int(result.stdout) < limits.processes
    assert leftovers(sandbox) == {}


def test_the_sandbox_says_which_limits_bind_a_whole_run(sandbox):
    enforced = sandbox.enforced_limits()
    assert enforced["memory"].startswith("per run")
    assert enforced["processes"].startswith("per run")
    assert enforced["disk"].startswith("per run")
    line = sandbox.describe()
    assert "\n" not in line and sandbox.level.value in line and "memory per run" in line


def _mounts_under(base: str) -> list[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(base)]


def test_each_run_gets_a_fresh_tmpfs_and_leaves_no_mount(sandbox):
    write = "import os\nopen(os.path.join(os.environ['TMPDIR'], 'left'), 'w').close()\nopen('left', 'w').close()\n"
    look = "import os\nprint(sorted(os.listdir('.')), os.listdir(os.environ['TMPDIR']))\n"
    argv = LANGUAGES["python"].run
    for _ in range(sandbox.slots):  # every slot has held a run that left files
        assert sandbox.run(argv, files={"main.py": write.encode()}).exit_code == 0
    for _ in range(sandbox.slots):
        assert sandbox.run(argv, files={"main.py": look.encode()}).stdout == b"['main.py'] []\n"
    # Only this sandbox's slots are looked at: other test processes may be running sandboxes.
    ours = [os.path.join(mounts.BASE, str(uid)) for uid in sandbox.uids]
    assert [m for m in _mounts_under(mounts.BASE) if m.startswith(tuple(ours))] == []  # no run's tmpfs left
    assert _mounts_under(mounts.BASE).count(mounts.BASE) == 1  # the private base, once
    with Sandbox(sandbox.level, slots=1, uid_base=sandbox.uids[-1] + 1):
        pass
    assert _mounts_under(mounts.BASE).count(mounts.BASE) == 1  # a second sandbox stacks nothing
