"""Named crash points, for tests that a run survives SIGKILL at precise moments.

``RLX_FAILPOINTS="trainer.step@2,params.put@1"`` makes the process SIGKILL itself the 2nd time
it reaches ``failpoint("trainer.step")`` and the 1st time it reaches ``failpoint("params.put")``.
Unset (the normal case), a failpoint is one dictionary lookup. Only I/O shells call them; nothing
that decides reads the environment.

Points: ``trainer.step`` (a step computed, its weights not yet written), ``params.put`` (a
version's arrays written, its manifest not yet), ``inference.generate`` (completions generated,
not yet submitted).
"""

from __future__ import annotations

import os
import signal
import threading

from runtime.errors import UsageError


def _parse(text: str) -> dict[str, int]:
    points = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, count = item.partition("@")
        if not sep or not count.isdigit() or int(count) < 1:
            raise UsageError(f"RLX_FAILPOINTS item {item!r} is not accepted; write name@N with N >= 1")
        points[name] = int(count)
    return points


_ARMED = _parse(os.environ.get("RLX_FAILPOINTS", ""))
_SEEN: dict[str, int] = {}
_LOCK = threading.Lock()


def failpoint(name: str) -> None:
    """SIGKILL this process if ``name`` is armed and reached for the armed time."""
    if name not in _ARMED:
        return
    with _LOCK:
        _SEEN[name] = _SEEN.get(name, 0) + 1
        if _SEEN[name] == _ARMED[name]:
            os.kill(os.getpid(), signal.SIGKILL)
