"""RLX_FAILPOINTS: the accepted forms, what a ``raise`` point does on each reach, and the test
switch without which the variable is ignored."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys

import pytest

from runtime import failpoints
from runtime.errors import UsageError

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_the_accepted_forms_parse_and_bad_ones_name_the_item():
    assert failpoints._parse("trainer.step@2, inference.generate@1:sleep=3,ledger.snapshot@4:raise=2") == {
        "trainer.step": (2, None, 0), "inference.generate": (1, 3.0, 0), "ledger.snapshot": (4, None, 2)}
    for bad in ["x", "x@0", "x@1:raise=0", "x@1:raise=-1", "x@1:raise=y", "x@1:raise=1000001", "x@1:sleep=601",
                "x@1:boom=1"]:
        with pytest.raises(UsageError, match=f"item {bad!r} is not accepted"):
            failpoints._parse(bad)


def test_a_raise_point_raises_an_io_error_on_the_armed_reaches_only(monkeypatch):
    monkeypatch.setattr(failpoints, "_ARMED", failpoints._parse("p@2:raise=2"))
    monkeypatch.setattr(failpoints, "_SEEN", {})
    outcomes = []
    for _ in range(5):
        try:
            failpoints.failpoint("p")
            outcomes.append(None)
        except OSError as e:
            outcomes.append((e.errno, e.strerror))
    assert outcomes == [None, (errno.EIO, "failpoint p (reach 2)"), (errno.EIO, "failpoint p (reach 3)"), None, None]
    failpoints.failpoint("other")  # not armed: nothing happens


_REACH = "from runtime.failpoints import failpoint; failpoint('p'); print('alive')"


def _reach(env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in (failpoints.VARIABLE, failpoints.SWITCH)}
    return subprocess.run([sys.executable, "-c", _REACH], env={**base, "PYTHONPATH": ROOT, **env},
                          capture_output=True, text=True, timeout=60)


def test_failpoints_are_armed_only_under_the_test_switch_and_say_so():
    ignored = _reach({failpoints.VARIABLE: "p@1"})
    assert ignored.returncode == 0 and ignored.stdout == "alive\n"
    assert ignored.stderr == ("rlx: warning: RLX_FAILPOINTS is ignored: failpoints are armed only in tests, "
                              "under RLX_TEST_FAILPOINTS=1\n")
    killed = _reach(failpoints.test_environment("p@1"))
    assert killed.returncode == -signal.SIGKILL and killed.stdout == ""
    assert killed.stderr == ("rlx: failpoints armed (RLX_FAILPOINTS='p@1', RLX_TEST_FAILPOINTS=1): "
                             "this process may kill itself\n")
    quiet = _reach({failpoints.SWITCH: "1"})  # the switch alone arms nothing and says nothing
    assert quiet.returncode == 0 and quiet.stdout == "alive\n" and quiet.stderr == ""


def test_the_switch_and_a_bad_value_are_checked_when_read():
    lines: list[str] = []
    assert failpoints.armed({failpoints.VARIABLE: "x@0"}, lines.append) == {}  # ignored: not parsed
    assert len(lines) == 1 and "is ignored" in lines[0]
    with pytest.raises(UsageError, match="item 'x@0' is not accepted"):
        failpoints.armed(failpoints.test_environment("x@0"), lines.append)
    with pytest.raises(UsageError, match="RLX_TEST_FAILPOINTS='yes' is not accepted; set it to 1"):
        failpoints.armed({failpoints.SWITCH: "yes"}, lines.append)


@pytest.mark.parametrize("argv", [["ledger", "stats", "/nonexistent"], ["verify", "math", "--gold", "1", "--answer", "1"],
                                  ["run", "--steps", "-1"], ["export", "d", "--version", "0", "--out", "o"]])
def test_a_bad_value_is_one_line_for_every_command(argv, tmp_path):
    """Read before the command runs (no traceback at import): exit 2 and the item named."""
    base = {k: v for k, v in os.environ.items() if k not in (failpoints.VARIABLE, failpoints.SWITCH)}
    done = subprocess.run([sys.executable, "-m", "runtime.cli", *argv], cwd=tmp_path, capture_output=True, text=True,
                          env={**base, "PYTHONPATH": ROOT, **failpoints.test_environment("trainer.step@2,bad")},
                          timeout=60)
    assert done.returncode == 2 and done.stderr == (
        "rlx: error: RLX_FAILPOINTS item 'bad' is not accepted; write name@N, name@N:sleep=S or "
        "name@N:raise=K with N >= 1\n")
    assert os.listdir(tmp_path) == []
