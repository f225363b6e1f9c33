"""Named fault points, for tests that a run survives SIGKILL, or slow work, at precise moments.

``RLX_FAILPOINTS="trainer.step@2,params.put@1"`` makes the process SIGKILL itself the 2nd time
it reaches ``failpoint("trainer.step")`` and the 1st time it reaches ``failpoint("params.put")``;
``inference.generate@1:sleep=3`` makes the 1st generation take 3 more seconds instead (work
longer than the lease timeout); ``ledger.snapshot@2:raise=3`` makes the 2nd, 3rd and 4th reach
raise an ``OSError`` (EIO), as a failing disk would, for code that must survive an error rather
than a kill. Unset (the normal case), a failpoint is one dictionary lookup.
Only I/O shells call them; nothing that decides reads the environment.

They are armed only under the test switch ``RLX_TEST_FAILPOINTS=1`` (which worker processes
inherit): a production run never kills itself because a variable was left in its environment.
Armed, the process says so in one line on stderr; set without the switch, ``RLX_FAILPOINTS`` is
ignored with a one-line warning. The variables are read once, at the first ``failpoint`` or
``check`` call (every ``rlx`` command calls ``check`` first, so a bad value is a one-line error
before any work), not at import.

Points: ``trainer.step`` (a step computed, its weights not yet written), ``params.put`` (a
version's arrays written, its manifest not yet), ``inference.generate`` (completions generated,
not yet submitted), ``ledger.snapshot`` (a controller snapshot inserted, its transaction not yet
committed), ``gang.rankR.compile`` (rank R of a trainer gang about to compile a step's program:
a slow compile on one rank).
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping

from runtime.errors import UsageError

VARIABLE = "RLX_FAILPOINTS"
SWITCH = "RLX_TEST_FAILPOINTS"
"""``RLX_TEST_FAILPOINTS=1`` arms ``RLX_FAILPOINTS``; tests set both (``test_environment``)."""
MAX_SLEEP_S = 600.0
MAX_RAISES = 1_000_000


def _parse(text: str) -> dict[str, tuple[int, float | None, int]]:
    """``{name: (N, sleep seconds or None, raises)}``; ``raises`` > 0: raise on reaches N .. N+raises-1."""
    points: dict[str, tuple[int, float | None, int]] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, rest = item.partition("@")
        count, _, action = rest.partition(":")
        sleep: float | None = None
        raises = 0
        if action:
            key, _, value = action.partition("=")
            try:
                if key == "sleep":
                    sleep = float(value)
                    ok = 0 <= sleep <= MAX_SLEEP_S
                else:
                    raises = int(value) if key == "raise" and value.isdigit() else 0
                    ok = 1 <= raises <= MAX_RAISES
            except ValueError:
                ok = False
            if not ok:
                raise UsageError(f"{VARIABLE} item {item!r} is not accepted; the action must be sleep=S "
                                 f"with 0 <= S <= {MAX_SLEEP_S:g} or raise=K with 1 <= K <= {MAX_RAISES}")
        if not sep or not count.isdigit() or int(count) < 1:
            raise UsageError(f"{VARIABLE} item {item!r} is not accepted; write name@N, name@N:sleep=S or "
                             "name@N:raise=K with N >= 1")
        points[name] = (int(count), sleep, raises)
    return points


def armed(environ: Mapping[str, str], say: Callable[[str], None]) -> dict[str, tuple[int, float | None, int]]:
    """The points ``environ`` arms: ``RLX_FAILPOINTS`` parsed when ``RLX_TEST_FAILPOINTS=1``,
    else none. ``say`` gets the one line that tells an armed process (or one whose points are
    ignored) so.

    Raises:
      UsageError: the switch has another value than 1, or (switched on) an item is malformed.
    """
    text = environ.get(VARIABLE, "")
    switch = environ.get(SWITCH)
    if switch not in (None, "", "0", "1"):
        raise UsageError(f"{SWITCH}={switch!r} is not accepted; set it to 1 (arm {VARIABLE}, in tests) or unset it")
    if not text.strip():
        return {}
    if switch != "1":
        say(f"rlx: warning: {VARIABLE} is ignored: failpoints are armed only in tests, under {SWITCH}=1")
        return {}
    points = _parse(text)
    if points:
        say(f"rlx: failpoints armed ({VARIABLE}={text.strip()!r}, {SWITCH}=1): this process may kill itself")
    return points


def test_environment(points: str) -> dict[str, str]:
    """The environment entries that arm ``points`` in a child process (for tests)."""
    return {VARIABLE: points, SWITCH: "1"}


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


_ARMED: dict[str, tuple[int, float | None, int]] | None = None  # read from the environment at first use
_SEEN: dict[str, int] = {}
_LOCK = threading.Lock()


def check() -> None:
    """Read ``RLX_FAILPOINTS`` now (once per process): the one line an armed process says, or a
    ``UsageError`` for a bad value, before the command does anything."""
    _points()


def _points() -> dict[str, tuple[int, float | None, int]]:
    global _ARMED
    if _ARMED is None:
        with _LOCK:
            if _ARMED is None:
                _ARMED = armed(os.environ, _stderr)
    return _ARMED


def failpoint(name: str) -> None:
    """SIGKILL this process (or sleep, or raise ``OSError``) if ``name`` is armed and reached for
    the armed time (the armed times, for ``raise``)."""
    points = _points()
    if name not in points:
        return
    count, sleep, raises = points[name]
    with _LOCK:
        _SEEN[name] = seen = _SEEN.get(name, 0) + 1
    if raises:
        if count <= seen < count + raises:
            raise OSError(errno.EIO, f"failpoint {name} (reach {seen})")
        return
    if seen != count:
        return
    if sleep is None:
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        time.sleep(sleep)
