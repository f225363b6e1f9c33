"""Only a trainer gang's ranks reach its coordinator.

``jax.distributed``'s coordination service has no authentication: one ``RegisterTask`` from any
process that can connect to it aborts every rank (SIGABRT). On one machine the gang's coordinator
is therefore a Unix socket in a directory only its user can enter; another user's process (here:
one that drops to ``nobody`` after loading JAX's client) cannot connect, and the gang goes on.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from runtime.errors import UsageError
from runtime.service.supervisor import private_coordinator
from runtime.trainer.gang import MAX_SOCKET_PATH, GangSpec, check_private
from tests.runtime.small_run import TINY
from tests.runtime.trainer.test_gang import ROOT, _env, _free_port, _spawns

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="another user's process needs root to start as that user")

# Another user's process with JAX's own coordination client: ``attempts`` times, it connects to
# ``address`` and, if that works, registers as task 1 (taken by the gang's rank 1). One line per
# attempt says how far it got.
ATTACKER = """
    import json, os, socket, sys
    from jax._src.lib import _jax
    address, attempts = sys.argv[1], int(sys.argv[2])
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
    for _ in range(attempts):
        if address.startswith("unix:"):
            probe, target = socket.socket(socket.AF_UNIX), address[len("unix:"):]
        else:
            host, port = address.rsplit(":", 1)
            probe, target = socket.socket(socket.AF_INET), (host, int(port))
        try:
            probe.connect(target)
        except OSError as e:
            print(json.dumps({"reached": False, "error": e.strerror}), flush=True)
            continue
        finally:
            probe.close()
        print(json.dumps({"reached": True, "error": None}), flush=True)
        client = _jax.get_distributed_runtime_client(address, 1, init_timeout=5)
        client.connect()  # RegisterTask as task 1
"""

# A gang rank that passes ``ticks`` barriers half a second apart, then reports.
TICKING_RANK = """
    import json, sys, time
    size, rank, address, ticks = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    from runtime.trainer.gang import Gang, GangSpec
    gang = Gang.join(GangSpec(rank, size, address))
    print("joined", flush=True)
    for _ in range(ticks):
        gang.barrier("tick")
        time.sleep(0.5)
    print(json.dumps({"rank": rank, "ticks": ticks}), flush=True)
    gang.shutdown()
"""


def _attack(address: str, attempts: int = 1) -> list[dict]:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(ATTACKER), address, str(attempts)], cwd=ROOT,
                          env=_env(), capture_output=True, text=True, timeout=120)
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-2000:]
    return [json.loads(line) for line in lines]


def _ranks(address: str, ticks: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", textwrap.dedent(TICKING_RANK), "2", str(rank), address,
                              str(ticks)], cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for rank in range(2)]


def _wait_joined(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "joined", proc.communicate()[1][-2000:]


def test_a_gang_coordinator_is_a_unix_socket_or_a_port_in_range_in_one_line(tmp_path):
    assert GangSpec.parse("1/2", "unix:/tmp/g/coordinator.sock") == GangSpec(1, 2, "unix:/tmp/g/coordinator.sock")
    assert GangSpec.parse("1/2", "unix:/tmp/g/c.sock").socket_path == "/tmp/g/c.sock"
    assert GangSpec.parse("0/2", "10.0.0.1:65535").socket_path is None
    long = "unix:/" + "d" * MAX_SOCKET_PATH
    for coordinator, words in (("127.0.0.1:70000", "1 <= PORT <= 65535"), ("127.0.0.1:0", "1 <= PORT <= 65535"),
                               ("unix:relative.sock", "must be absolute"), (long, f"at most {MAX_SOCKET_PATH} bytes")):
        with pytest.raises(UsageError) as e:
            GangSpec.parse("0/2", coordinator)
        assert words in str(e.value) and repr(coordinator) in str(e.value) and "\n" not in str(e.value)

    address, directory = private_coordinator()
    try:
        assert address == f"unix:{directory}/coordinator.sock"
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700 and os.stat(directory).st_uid == os.geteuid()
        check_private(GangSpec(0, 2, address))  # private: no error
    finally:
        os.rmdir(directory)
    check_private(GangSpec(0, 2, "127.0.0.1:7100"))  # a port: nothing to check here
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    open_dir.chmod(0o755)
    with pytest.raises(UsageError) as e:
        check_private(GangSpec(0, 2, f"unix:{open_dir}/c.sock"))
    assert f"its directory {open_dir} (owner uid {os.geteuid()}, mode 755) is open to other users" in str(e.value)
    with pytest.raises(UsageError, match="cannot be used .No such file or directory.; make one only you can enter"):
        check_private(GangSpec(0, 2, f"unix:{tmp_path}/missing/c.sock"))


def test_rank_0_refuses_a_socket_directory_others_can_enter_in_one_line(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    proc = subprocess.run([sys.executable, "-m", "runtime.cli", "worker", "trainer", "--controller", "127.0.0.1:1",
                           "--gang", "0/2", "--coordinator", f"unix:{open_dir}/c.sock"], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "mode 777) is open to other users" in proc.stderr and "Traceback" not in proc.stderr
    assert not (open_dir / "c.sock").exists()  # no coordinator was served


@pytest.mark.slow
@as_root
def test_another_users_register_task_aborts_a_gang_on_a_port_and_cannot_reach_one_on_a_private_socket():
    """The attack and the defence side by side: the same process of another user aborts both
    ranks of a gang whose coordinator is a loopback port, and cannot connect to the private
    socket of another, which finishes its barriers."""
    tcp = f"127.0.0.1:{_free_port()}"
    private, directory = private_coordinator()
    try:
        exposed, guarded = _ranks(tcp, 60), _ranks(private, 12)
        _wait_joined(exposed + guarded)
        assert _attack(tcp) == [{"reached": True, "error": None}]
        assert _attack(private) == [{"reached": False, "error": "Permission denied"}]
        for proc in exposed:
            proc.communicate(timeout=120)
            assert proc.returncode == -signal.SIGABRT
        for rank, proc in enumerate(guarded):
            stdout, stderr = proc.communicate(timeout=120)
            assert proc.returncode == 0, stderr[-2000:]
            assert json.loads(stdout.strip().splitlines()[-1]) == {"rank": rank, "ticks": 12}
    finally:
        for proc in [*exposed, *guarded]:
            if proc.poll() is None:
                proc.kill()
        shutil.rmtree(directory, ignore_errors=True)


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode().split("\0")


@pytest.mark.slow
@as_root
def test_a_runs_gang_is_not_reachable_by_another_users_process_and_runs_to_the_end(tmp_path):
    """``rlx run`` with a gang of 2: five ``RegisterTask`` attempts in a row from another user's
    process, on the coordinator named in the ranks' argv, while the gang trains; the gang is
    never restarted and the run completes."""
    out = str(tmp_path / "gang")
    argv = [sys.executable, "-m", "runtime.cli", "run", "--out", out, "--steps", "8", "--no-progress"]
    for o in [*TINY, "eval.every_steps=0", "trainer.mesh={fsdp=2}", "workers.trainer_processes=2"]:
        argv += ["--set", o]
    run = subprocess.Popen(argv, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while not os.path.exists(os.path.join(out, "params", "manifests", "v1.json")):
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
            time.sleep(0.2)
        ranks = sorted(_spawns(out), key=lambda s: s["rank"])
        argvs = [_cmdline(s["pid"]) for s in ranks]
        address = argvs[0][argvs[0].index("--coordinator") + 1]
        assert all(a[a.index("--coordinator") + 1] == address for a in argvs)
        assert _attack(address, 5) == [{"reached": False, "error": "Permission denied"}] * 5
        assert all(os.path.exists(f"/proc/{s['pid']}") for s in ranks)  # the gang was alive throughout
        assert address.startswith("unix:"), address  # no TCP port for the coordinator
        directory = os.path.dirname(address[len("unix:"):])
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
        stdout, stderr = run.communicate(timeout=600)
        assert run.returncode == 0, stderr[-3000:]
    finally:
        if run.poll() is None:
            run.kill()
    assert sorted((s["worker_id"], s["rank"]) for s in _spawns(out)) == [("trainer-0.1", 0), ("trainer-0.1", 1)]
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        assert json.load(f)["steps"] == 8
    assert not os.path.exists(directory)  # the socket's directory goes with the gang


def test_a_socket_connect_is_refused_for_another_user_only_by_the_directory(tmp_path):
    """What the defence rests on: a socket in a 0700 directory is out of another user's reach
    even when the socket file itself is world-writable."""
    if os.geteuid() != 0:
        pytest.skip("another user's process needs root to start as that user")
    address, directory = private_coordinator()
    path = address[len("unix:"):]
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(path)
        os.chmod(path, 0o777)
        server.listen(1)
        assert _attack(address) == [{"reached": False, "error": "Permission denied"}]
    finally:
        server.close()
        shutil.rmtree(directory)
