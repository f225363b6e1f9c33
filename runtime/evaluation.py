"""Held-out evaluation of weight versions during a run (the ``eval`` config section).

What is measured, for one version: on the first ``eval.size`` held-out problems of the task, the
greedy pass rate (one greedy completion each) and pass@k from ``eval.samples`` completions each at
the run's sampling parameters, estimated without bias (:func:`pass_at_k`). Both are pure
functions of (weights, task, config, run seed, version): greedy decoding has no randomness, each
sampled completion has its own seed ``rng.EVAL_SAMPLE(version, problem, sample)``, and the engine
is batch-invariant, so neither the batch an evaluation shares nor the thread that runs it changes
a bit of its result.

Who evaluates: the process that hosts the controller (``rlx run``, ``rlx resume``), in a
background thread, in both worker modes. When a ``WeightsPublished`` of a version that
``eval.every_steps`` makes due commits (``ControllerSpec.evaluated``: every N-th version from 0
on, and the final one), :class:`Evaluator` holds that version in the parameter store against
deletion, loads it, evaluates it with an engine of its own and submits a ``VersionEvaluated``
through the controller, which admits one per due version naming its published digest. The
evaluation only reads versions: the run's decisions and training bits are the same with it or
without it. A resumed run evaluates the due versions it had not evaluated yet, where the
parameter store still holds them; the final version's evaluation is waited for before ``rlx run``
writes its summary.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ledger import events as ev
from runtime import rng
from runtime.errors import RlxError

Log = Callable[[str], None]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from ``n`` samples of which ``c`` passed.

    ``1 - C(n - c, k) / C(n, k)`` (Chen et al. 2021, "Evaluating Large Language Models Trained on
    Code"), computed as ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)`` to stay exact in floats.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def sample_seeds(seed: int, version: int, problems: int, samples: int) -> list[int]:
    """The seeds of the sampled completions of ``version``'s evaluation, problem-major."""
    return [rng.derive_seed(seed, rng.EVAL_SAMPLE, version, i, j) for i in range(problems) for j in range(samples)]


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One version's held-out results (the fields of its ``VersionEvaluated``)."""

    problems: int
    greedy_pass_rate: float
    k: int
    samples: int
    pass_at_k: float
    sampled_pass_rate: float


def _held_out(task: Any, codec: Any, size: int) -> tuple[list, list]:
    """The first ``size`` held-out problems of ``task`` (at most its held-out split) and their prompts."""
    problems = [task.problem("eval", i) for i in range(min(size, task.eval_size))]
    return problems, [codec.encode_prompt(p) for p in problems]


def _greedy(codec: Any, max_tokens: int):
    """Greedy decoding of at most ``max_tokens`` tokens, stopping at the model's end tokens."""
    from runtime.inference import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=codec.eos_ids)


def evaluate(engine: Any, task: Any, codec: Any, params: Any, *, version: int, seed: int, size: int, k: int,
             samples: int, sampling: dict) -> Evaluation:
    """Evaluate ``params`` (version ``version``) on the first ``size`` held-out problems of
    ``task`` with ``engine``: greedy pass rate and pass@``k`` from ``samples`` completions each,
    sampled with ``sampling`` (a rollout request's sampling table)."""
    from runtime.inference import SamplingParams

    problems, prompts = _held_out(task, codec, size)
    n = len(problems)
    engine.update_params(params)
    greedy = _greedy(codec, int(sampling["max_tokens"]))
    sampled = SamplingParams.from_request(sampling, codec.eos_ids)
    requests = prompts + [p for p in prompts for _ in range(samples)]
    params_list = [greedy] * n + [sampled] * (n * samples)
    seeds = list(range(n)) + sample_seeds(seed, version, n, samples)  # greedy ignores its seed
    every = problems + [p for p in problems for _ in range(samples)]
    texts = _texts(engine, task, codec, every, requests, params_list, seeds)
    passed = [bool(o.passed) for o in task.score(every, texts)]
    greedy_passed, sampled_passed = passed[:n], np.asarray(passed[n:], dtype=bool).reshape(n, samples)
    counts = sampled_passed.sum(axis=1)
    return Evaluation(
        problems=n,
        greedy_pass_rate=float(np.mean(greedy_passed)),
        k=k,
        samples=samples,
        pass_at_k=float(np.mean([pass_at_k(samples, int(c), k) for c in counts])),
        sampled_pass_rate=float(sampled_passed.mean()),
    )


def greedy_pass_rate(engine: Any, task: Any, codec: Any, params: Any, *, size: int, max_tokens: int) -> float:
    """The greedy pass rate of ``params`` on the first ``size`` held-out problems of ``task``
    (``rlx pretrain``'s measure of a warm start; a run records :func:`evaluate`'s)."""
    problems, prompts = _held_out(task, codec, size)
    engine.update_params(params)
    texts = _texts(engine, task, codec, problems, prompts, [_greedy(codec, max_tokens)] * len(problems),
                   list(range(len(problems))))
    return float(np.mean([o.passed for o in task.score(problems, texts)]))


def _texts(engine: Any, task: Any, codec: Any, problems: list, prompts: list, params: list, seeds: list) -> list[str]:
    """The texts to score of one completion per prompt: of a multi-turn task, an episode's last
    turn, its tools called as in a run (``runtime.episodes.rollout``)."""
    if getattr(task, "multi_turn", False):
        from runtime.episodes.rollout import EpisodeSampler, final_ids

        sampler = EpisodeSampler(engine, lambda: task.environment(codec), turn_tokens=task.turn_tokens)
        return [codec.decode(final_ids(e.tokens, e.turns)) for e in sampler.generate(problems, params, seeds)]
    return [codec.decode(c.tokens) for c in engine.generate(prompts, params, seeds)]


class Evaluator:
    """Evaluates due versions in a background thread of the controller's process (see the module
    docstring) and submits each result through ``ctrl``.

    ``observe`` is the controller's commit hook (it runs under the controller's lock and only
    queues); ``retirer`` (``hold``/``release``) keeps a queued version in the parameter store
    until it is loaded.
    """

    def __init__(self, *, engine: Any, task: Any, codec: Any, pstore: Any, ctrl: Any, retirer: Any, config: Any,
                 log: Log = print, name: str = "evaluator") -> None:
        self.engine, self.task, self.codec = engine, task, codec
        self.pstore, self.ctrl, self.retirer, self.log, self.name = pstore, ctrl, retirer, log, name
        e = config.eval
        self.size = e.size
        self.k = e.k if e.k is not None else config.sampling.group_size
        self.samples = e.samples if e.samples is not None else self.k
        self.sampling = config.sampling.request()
        self.seed = config.run.seed
        self.error: BaseException | None = None
        self.recorded: list[ev.VersionEvaluated] = []
        self._queue: queue.Queue[tuple[int, str] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._abandoned = threading.Event()

    def observe(self, events: Sequence[ev.Event]) -> None:
        """Queue every committed ``WeightsPublished`` that is due for evaluation."""
        spec = self.ctrl.state.spec
        for e in events:
            if type(e) is ev.WeightsPublished and spec is not None and spec.evaluated(e.version):
                self._enqueue(e.version, e.digest)

    def _enqueue(self, version: int, digest: str) -> None:
        self.retirer.hold(version)
        self._queue.put((version, digest))

    def start(self) -> None:
        """Queue the due evaluations the run already has (a resume's), where the parameter store
        still holds their versions, and start the thread."""
        stored = set(self.pstore.versions())
        for version, digest in self.ctrl.state.due_evaluations:
            if version in stored:
                self._enqueue(version, digest)
            else:
                self.log(f"evaluation of version {version} skipped: the parameter store no longer holds it")
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def close(self, *, wait: bool = True) -> None:
        """Finish the queued evaluations (``wait``) or drop them, stop the thread, and raise the
        error that stopped it, if any."""
        if not wait:
            self._abandoned.set()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join()
        if self.error is not None and wait:
            raise self.error

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            version, digest = item
            if self._abandoned.is_set() or self.error is not None:
                self.retirer.release(version)
                continue
            try:
                self._evaluate(version, digest)
            except BaseException as e:  # surfaced by close()
                self.error = e

    def _evaluate(self, version: int, digest: str) -> None:
        try:
            params = self.pstore.get(version)
            stored = self.pstore.digest(version)
        finally:
            self.retirer.release(version)
        if stored != digest:
            raise RlxError(f"version {version} in the parameter store has digest {stored[:16]}, "
                           f"the ledger names {digest[:16]}")
        result = evaluate(self.engine, self.task, self.codec, params, version=version, seed=self.seed,
                          size=self.size, k=self.k, samples=self.samples, sampling=self.sampling)
        event = ev.VersionEvaluated(version, digest, result.problems, result.greedy_pass_rate, result.k,
                                    result.samples, result.pass_at_k, result.sampled_pass_rate, self.name)
        verdict = self.ctrl.submit([event])[0]
        if verdict.accepted:
            self.recorded.append(event)
        else:
            self.log(f"evaluation of version {version} not recorded: {verdict.reason}")


__all__ = ["Evaluation", "Evaluator", "evaluate", "greedy_pass_rate", "pass_at_k", "sample_seeds"]
