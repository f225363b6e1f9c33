"""Named fault points, for tests that a run survives SIGKILL, or slow work, at precise moments.

``RLX_FAILPOINTS="trainer.step@2,params.put@1"`` makes the process SIGKILL itself the 2nd time
it reaches ``failpoint("trainer.step")`` and the 1st time it reaches ``failpoint("params.put")``;
``inference.generate@1:sleep=3`` makes the 1st generation take 3 more seconds instead (work
longer than the lease timeout); ``ledger.snapshot@2:raise=3`` makes the 2nd, 3rd and 4th reach
raise an ``OSError`` (EIO), as a failing disk would, for code that must survive an error rather
than a kill. Unset (the normal case), a failpoint is one dictionary lookup.
Only I/O shells call them; nothing that decides reads the environment.

Points: ``trainer.step`` (a step computed, its weights not yet written), ``params.put`` (a
version's arrays written, its manifest not yet), ``inference.generate`` (completions generated,
not yet submitted), ``ledger.snapshot`` (a controller snapshot inserted, its transaction not yet
committed).
"""

from __future__ import annotations

import errno
import os
import signal
import threading
import time

from runtime.errors import UsageError

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
                raise UsageError(f"RLX_FAILPOINTS item {item!r} is not accepted; the action must be sleep=S "
                                 f"with 0 <= S <= {MAX_SLEEP_S:g} or raise=K with 1 <= K <= {MAX_RAISES}")
        if not sep or not count.isdigit() or int(count) < 1:
            raise UsageError(f"RLX_FAILPOINTS item {item!r} is not accepted; write name@N, name@N:sleep=S or "
                             "name@N:raise=K with N >= 1")
        points[name] = (int(count), sleep, raises)
    return points


_ARMED = _parse(os.environ.get("RLX_FAILPOINTS", ""))
_SEEN: dict[str, int] = {}
_LOCK = threading.Lock()


def failpoint(name: str) -> None:
    """SIGKILL this process (or sleep, or raise ``OSError``) if ``name`` is armed and reached for
    the armed time (the armed times, for ``raise``)."""
    if name not in _ARMED:
        return
    count, sleep, raises = _ARMED[name]
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
