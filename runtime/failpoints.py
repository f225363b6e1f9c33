"""Named fault points, for tests that a run survives SIGKILL, or slow work, at precise moments.

``RLX_FAILPOINTS="trainer.step@2,params.put@1"`` makes the process SIGKILL itself the 2nd time
it reaches ``failpoint("trainer.step")`` and the 1st time it reaches ``failpoint("params.put")``;
``inference.generate@1:sleep=3`` makes the 1st generation take 3 more seconds instead (work
longer than the lease timeout). Unset (the normal case), a failpoint is one dictionary lookup.
Only I/O shells call them; nothing that decides reads the environment.

Points: ``trainer.step`` (a step computed, its weights not yet written), ``params.put`` (a
version's arrays written, its manifest not yet), ``inference.generate`` (completions generated,
not yet submitted), ``ledger.snapshot`` (a controller snapshot inserted, its transaction not yet
committed).
"""

from __future__ import annotations

import os
import signal
import threading
import time

from runtime.errors import UsageError

MAX_SLEEP_S = 600.0


def _parse(text: str) -> dict[str, tuple[int, float | None]]:
    points: dict[str, tuple[int, float | None]] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, rest = item.partition("@")
        count, _, action = rest.partition(":")
        sleep: float | None = None
        if action:
            key, _, value = action.partition("=")
            try:
                sleep = float(value) if key == "sleep" else None
            except ValueError:
                sleep = None
            if sleep is None or not 0 <= sleep <= MAX_SLEEP_S:
                raise UsageError(f"RLX_FAILPOINTS item {item!r} is not accepted; the action must be sleep=S "
                                 f"with 0 <= S <= {MAX_SLEEP_S:g}")
        if not sep or not count.isdigit() or int(count) < 1:
            raise UsageError(f"RLX_FAILPOINTS item {item!r} is not accepted; write name@N or name@N:sleep=S with N >= 1")
        points[name] = (int(count), sleep)
    return points


_ARMED = _parse(os.environ.get("RLX_FAILPOINTS", ""))
_SEEN: dict[str, int] = {}
_LOCK = threading.Lock()


def failpoint(name: str) -> None:
    """SIGKILL this process (or sleep) if ``name`` is armed and reached for the armed time."""
    if name not in _ARMED:
        return
    count, sleep = _ARMED[name]
    with _LOCK:
        _SEEN[name] = _SEEN.get(name, 0) + 1
        hit = _SEEN[name] == count
    if not hit:
        return
    if sleep is None:
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        time.sleep(sleep)
