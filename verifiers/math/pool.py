"""Math verification under a hard time bound that works from any thread.

math-verify and sympy can take unbounded time on hostile text, and math-verify's own timeouts
use ``signal.alarm`` (main thread only; its timeout exception is a ``BaseException``). So judging
runs in worker processes (``python -m verifiers.math.worker``, started without ``fork`` so it is
safe in a threaded server): the caller waits on the worker's pipe with a deadline and, past it,
kills the worker; the next call starts a fresh one. The verdict for a timeout is ``TLE``.

Most answers never need a worker: ``judge.judge_bounded`` runs first, in the caller's thread,
and decides every answer that bounded work can (extraction, the exact grammar with its size
estimates); only answers that need math-verify or symbolic simplification go to a worker. So
scoring many plain numbers costs no process round trip, and no input can hold the caller.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import pathlib
import queue
import selectors
import subprocess
import sys
import threading
import time

from verifiers.errors import ConfigError
from verifiers.math.judge import MathConfig, judge_bounded, version
from verifiers.outcome import Outcome, Timings, Verdict

_START_TIMEOUT_S = 120.0  # a fresh worker imports sympy and math-verify; slow on a loaded host
_PACKAGE_ROOT = str(pathlib.Path(__file__).resolve().parents[2])


class _Worker:
    """One judging process and a line reader on its stdout."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH")]))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "verifiers.math.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )
        self._buffer = b""

    def send(self, message: dict) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        self.process.stdin.flush()

    def receive(self, timeout_s: float) -> object:
        """The next JSON line, or raise TimeoutError past ``timeout_s`` / EOFError if it died."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise TimeoutError
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise EOFError
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


class MathVerifier:
    """A bounded pool of math judging processes; ``verify`` is safe to call from any thread.

    Args:
      workers: how many judgings run at once (processes, started on first use).
      timeout_s: default hard bound on one judging, in seconds; the verdict past it is ``TLE``.
    """

    def __init__(self, workers: int = 2, timeout_s: float = 10.0):
        if not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"math workers {workers!r} must be an integer >= 1")
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ConfigError(f"math timeout_s {timeout_s!r} must be a number of seconds > 0")
        self.timeout_s = float(timeout_s)
        self._slots = threading.BoundedSemaphore(workers)
        self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()
        self._closed = False

    def _take(self) -> _Worker | None:
        """An idle worker, or a fresh one once it is ready; None if it cannot start."""
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        worker = _Worker()
        with self._lock:
            self._all.add(worker)
        try:
            if worker.receive(_START_TIMEOUT_S) == "ready":
                return worker
        except (TimeoutError, EOFError, ValueError):
            pass
        self._drop(worker)
        return None

    def _drop(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._all.discard(worker)

    def verify(
        self,
        gold: str,
        response: str,
        config: MathConfig = MathConfig(),
        timeout_s: float | None = None,
    ) -> Outcome:
        """Judge ``response`` against ``gold`` (see ``judge.judge_math``) within the time bound."""
        if self._closed:
            raise ConfigError("this MathVerifier is closed")
        limit = self.timeout_s if timeout_s is None else float(timeout_s)
        start = time.monotonic()
        decided = judge_bounded(gold, response, config)
        if decided is not None:
            return dataclasses.replace(decided, timings=Timings(wall_s=time.monotonic() - start))
        request = {
            "gold": gold,
            "response": response,
            "extract": config.extract,
            "rel_tol": None if config.rel_tol is None else str(config.rel_tol),
            "abs_tol": None if config.abs_tol is None else str(config.abs_tol),
        }
        with self._slots:
            worker = self._take()
            start = time.monotonic()
            if worker is None:
                return _failure(Verdict.INTERNAL_ERROR, "a math judge process failed to start", start)
            try:
                worker.send(request)
                result = worker.receive(limit)
            except TimeoutError:
                self._drop(worker)
                return _failure(Verdict.TLE, f"judging took longer than {limit:g} s", start)
            except (EOFError, OSError, ValueError):
                self._drop(worker)
                return _failure(Verdict.PARSE_ERROR, "the judge process died on this answer", start)
            self._idle.put(worker)
        assert isinstance(result, dict)
        if "error" in result:
            return _failure(Verdict.PARSE_ERROR, result["error"], start)
        outcome = Outcome.from_dict(result)
        return dataclasses.replace(outcome, timings=Timings(wall_s=time.monotonic() - start))

    def close(self) -> None:
        """Stop every worker process."""
        self._closed = True
        with self._lock:
            workers, self._all = list(self._all), set()
        for worker in workers:
            worker.kill()

    def __enter__(self) -> MathVerifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _failure(verdict: Verdict, detail: str, start: float) -> Outcome:
    return Outcome(verdict, detail, "math", version(), timings=Timings(wall_s=time.monotonic() - start))


_default: MathVerifier | None = None
_default_lock = threading.Lock()


def default_verifier() -> MathVerifier:
    """The process-wide ``MathVerifier`` behind ``verify_math`` (closed at exit)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = MathVerifier()
            atexit.register(_default.close)
        return _default


def verify_math(
    gold: str, response: str, *, config: MathConfig = MathConfig(), timeout_s: float = 10.0
) -> Outcome:
    """Judge a math answer with a hard time bound, from any thread (see ``MathVerifier``)."""
    return default_verifier().verify(gold, response, config, timeout_s=timeout_s)
