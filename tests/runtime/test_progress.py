"""Progress of long work on stderr (``runtime.progress``): lines off a terminal, a bar on one, and
the commands that show it — the warm start of ``rlx pretrain`` and ``rlx replay --json`` — with
stdout left to their answer."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time

import pytest

from runtime.cli import main
from runtime.errors import UsageError
from runtime.progress import INTERVAL_ENV, Progress
from tests.runtime import small_run as small

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_a_line_at_the_start_every_interval_and_at_the_end(monkeypatch):
    monkeypatch.setenv(INTERVAL_ENV, "5")
    clock, out = _Clock(), io.StringIO()
    with Progress("warm start", 10, stream=out, clock=clock) as bar:
        for step in range(1, 11):
            clock.now += 2.0  # a line when 5 s have passed since the last: after steps 3, 6 and 9
            bar.update(step, f"loss {1 / step:.3f}")
    # The time left is at the rate since the first step (a first step that compiles is slower):
    # 4 s for steps 2 and 3 leave 14 s for 7 more; 10 s for steps 2 to 6, 8 s for 4.
    assert out.getvalue().splitlines() == [
        "warm start: 0/10 steps (0%), 0 s",
        "warm start: 3/10 steps (30%), 6 s, about 14 s left, loss 0.333",
        "warm start: 6/10 steps (60%), 12 s, about 8 s left, loss 0.167",
        "warm start: 9/10 steps (90%), 18 s, about 2 s left, loss 0.111",
        "warm start: done, 10/10 steps (100%), 20 s, loss 0.100",
    ]


def test_a_slow_first_step_does_not_count_in_the_time_left(monkeypatch):
    monkeypatch.setenv(INTERVAL_ENV, "0")
    clock, out = _Clock(), io.StringIO()
    with Progress("run", 100, stream=out, clock=clock) as bar:
        clock.now += 30.0  # the first step compiles
        bar.update(1)
        clock.now += 2.0
        bar.update(3)  # 1 s a step since the first: 97 s for the 97 left
    assert out.getvalue().splitlines()[2] == "run: 3/100 steps (3%), 32 s, about 1 min 37 s left"


def test_an_unknown_total_a_failure_and_a_disabled_display(monkeypatch):
    monkeypatch.setenv(INTERVAL_ENV, "0")
    clock, out = _Clock(), io.StringIO()
    with pytest.raises(RuntimeError), Progress("reading the log", None, unit="events", stream=out, clock=clock) as bar:
        clock.now += 125
        bar.update(4096)
        raise RuntimeError("stop")
    assert out.getvalue().splitlines() == ["reading the log: 0 events, 0 s", "reading the log: 4,096 events, 2 min 05 s",
                                           "reading the log: stopped, 4,096 events, 2 min 05 s"]
    quiet = io.StringIO()
    with Progress("x", 3, stream=quiet, enabled=False) as bar:
        bar.update(3)
    assert quiet.getvalue() == ""


def test_work_that_cannot_count_ticks_with_its_time(monkeypatch):
    monkeypatch.setenv(INTERVAL_ENV, "0.05")
    out = io.StringIO()
    with Progress("verifying the hash chain", None, unit="", stream=out, tick=True):
        time.sleep(0.5)  # a call that returns when it is done: a line every 0.05 s meanwhile
    lines = out.getvalue().splitlines()
    assert lines[0] == "verifying the hash chain: 0 s" and lines[-1] == "verifying the hash chain: done, 0 s"
    assert len(lines) >= 3 and set(lines[1:-1]) == {"verifying the hash chain: 0 s"}


def test_on_a_terminal_a_bar(monkeypatch):
    monkeypatch.delenv(INTERVAL_ENV, raising=False)
    out = _Terminal()
    with Progress("replay", 3, stream=out) as bar:
        for step in (1, 2, 3):
            bar.update(step, "all match")
    text = out.getvalue()
    assert "replay" in text and "3/3" in text and "all match" in text and "━" in text
    assert not re.search(r"^replay: ", text, re.M)  # no progress lines


@pytest.mark.parametrize("bad", ["soon", "-1", "inf"])
def test_a_bad_interval_is_one_line(monkeypatch, bad):
    monkeypatch.setenv(INTERVAL_ENV, bad)
    with pytest.raises(UsageError, match=rf"^{INTERVAL_ENV}={bad!r} is not accepted; give the seconds between "
                                         "progress lines, a number >= 0$"):
        Progress("x", 1, stream=io.StringIO())


def test_rlx_pretrain_says_whether_it_trains_and_shows_the_steps(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(INTERVAL_ENV, "0")
    small.write_sums(tmp_path / "sums.jsonl")
    args = ["pretrain", "--data", str(tmp_path / "sums.jsonl"), "--steps", "12",
            *[x for o in [*small.TINY[1:], f'pretrain.cache_dir="{tmp_path / "cache"}"'] for x in ("--set", o)]]
    assert main(args) == 0
    first = capsys.readouterr()
    said = " ".join(first.out.split())  # rich wraps long lines
    assert "warm start: training 12 supervised steps of 128 problems (not in the cache;" in said
    lines = [line for line in first.err.splitlines() if line.startswith("warm start: ")]
    assert lines[0] == "warm start: 0/12 steps (0%), 0 s"
    assert [int(re.match(r"warm start: (\d+)/12", line).group(1)) for line in lines[1:-1]] == list(range(1, 13))
    assert re.fullmatch(r"warm start: done, 12/12 steps \(100%\), \d+ s, loss \d\.\d{3}", lines[-1])
    assert main(args) == 0
    again = capsys.readouterr()
    assert "warm start: loading 12 supervised steps from the cache (" in " ".join(again.out.split())
    assert "warm start:" not in again.err  # nothing trains


def test_rlx_replay_json_shows_progress_on_stderr_and_one_object_on_stdout(small_run):
    run_dir, summary, _ = small_run
    env = {**os.environ, INTERVAL_ENV: "0", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-m", "runtime.cli", "replay", run_dir, "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)  # stdout is the one object, nothing else
    assert report["match"] is True and report["final_digest"] == summary["final_digest"]
    err = done.stderr.splitlines()
    for label in ("reading the log", "folding the log"):  # the index's pass, the fold's
        assert any(re.fullmatch(rf"{label}: done, ([\d,]+)/\1 events \(100%\), \d+ s", line) for line in err), err
    assert any(re.fullmatch(r"verifying the hash chain of run 'run': done, \d+ s", line) for line in err), err
    steps = [line for line in err if line.startswith("replay: ")]
    assert steps[0] == f"replay: 0/{small.STEPS} steps (0%), 0 s"
    assert steps[-1].startswith(f"replay: done, {small.STEPS}/{small.STEPS} steps (100%), ")
    assert steps[-1].endswith(f", {small.STEPS + 1} versions match")
    assert len(steps) == small.STEPS + 2  # a line at the start, one a step (every 0 s) and one at the end
