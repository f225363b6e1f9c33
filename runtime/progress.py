"""Progress of long work (a warm start, a run's steps, a replay), shown on stderr.

On a terminal a live bar; otherwise (a pipe, a log file, CI) one line when the work starts, one
every ``RLX_PROGRESS_SECONDS`` (5 by default) and one when it ends, so that a quiet minute always
says what it is doing. stdout is left to the command's answer (``--json`` stays one object).

Only words: the wall clock read here decides what is shown and when, never what is computed.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from runtime.errors import UsageError

INTERVAL_ENV = "RLX_PROGRESS_SECONDS"
DEFAULT_INTERVAL_S = 5.0


def interval_s() -> float:
    """Seconds between two progress lines off a terminal: ``$RLX_PROGRESS_SECONDS`` or 5."""
    text = os.environ.get(INTERVAL_ENV)
    if text is None or not text.strip():
        return DEFAULT_INTERVAL_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < float("inf"):
        raise UsageError(f"{INTERVAL_ENV}={text!r} is not accepted; give the seconds between progress lines, "
                         "a number >= 0")
    return value


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class Progress:
    """Progress of one piece of work of ``total`` units (None: unknown), labelled ``label``.

    Use as a context manager, calling ``update`` as the work advances; ``enabled=False`` shows
    nothing. ``stream`` (default ``sys.stderr``) gets a bar when it is a terminal, else lines.
    Work that cannot count (a call that returns when done) passes ``tick``: its lines then come
    from a timer, saying how long it has run (``unit=""``: no count).
    """

    def __init__(self, label: str, total: int | None, *, unit: str = "steps", enabled: bool = True,
                 stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic, tick: bool = False):
        self.label, self.total, self.unit, self.enabled = label, total, unit, enabled
        self.stream = sys.stderr if stream is None else stream
        self.clock = clock
        self.done, self.info = 0, ""
        self.t0 = self.last = clock()
        self.first: tuple[float, int] | None = None  # (time, done) of the first update: the rate excludes a compile
        self.every = interval_s() if enabled else 0.0
        self.bar = None
        self.stop: threading.Event | None = None
        self.lock = threading.Lock()  # a timer's line and the last one, one after the other
        if not enabled:
            return
        if self.stream.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as Bar

            self.bar = Bar(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
                           TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                           console=Console(file=self.stream), redirect_stdout=False)  # stdout: the answer
            self.bar.start()
            self.task = self.bar.add_task(label, total=total, info="")
        else:
            self._line()
            if tick:
                self.stop = threading.Event()
                threading.Thread(target=self._tick, args=(self.stop, self.every or 1.0), daemon=True,
                                 name=f"progress: {label}").start()

    def _tick(self, stop: threading.Event, every: float) -> None:
        while not stop.wait(every):
            self._line()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close(finished=exc[0] is None)

    def _line(self, final: str = "") -> None:
        elapsed = self.clock() - self.t0
        count = f"{self.done:,}" if self.total is None else f"{self.done:,}/{self.total:,}"
        parts = [f"{count} {self.unit}"] if self.unit else []
        if self.unit and self.total:
            parts[0] += f" ({100 * self.done / self.total:.0f}%)"
        parts.append(_duration(elapsed))
        if not final and self.total and self.first is not None and self.first[1] < self.done < self.total:
            rate = (self.done - self.first[1]) / max(self.clock() - self.first[0], 1e-9)
            parts.append(f"about {_duration((self.total - self.done) / rate)} left")
        if self.info:
            parts.append(self.info)
        with self.lock:
            print(f"{self.label}: {', '.join([final, *parts] if final else parts)}", file=self.stream, flush=True)

    def update(self, done: int, info: str = "") -> None:
        """``done`` units finished so far; ``info`` a few words on the latest (e.g. a loss)."""
        self.done, self.info = done, info
        if self.first is None:
            self.first = (self.clock(), done)
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(self.task, completed=done, info=info)
            return
        now = self.clock()
        if now - self.last >= self.every:
            self.last = now
            self._line()

    def close(self, *, finished: bool = True) -> None:
        """End the display: the bar stops, or a last line says where the work ended."""
        if not self.enabled:
            return
        self.enabled = False
        if self.stop is not None:
            self.stop.set()
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done, info=self.info)
            self.bar.stop()
        else:
            self._line(final="done" if finished else "stopped")


__all__ = ["DEFAULT_INTERVAL_S", "INTERVAL_ENV", "Progress", "interval_s"]
