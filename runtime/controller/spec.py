"""What the controller needs to know of a run's config, read from the dict in ``RunStarted``.

The controller reads the stored, resolved config (``runtime.config.Config.to_dict``) through the
sections it needs (run, data, sampling, scheduling, params, eval), each checked by its own class. It
never builds the whole ``Config``, whose algorithm check imports the JAX kernels' registry:
folding a ledger needs no JAX.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

from runtime.config import DETERMINISTIC, FRESHEST
from runtime.errors import RlxError

__all__ = ["DETERMINISTIC", "FRESHEST", "ControllerSpec", "SpecError"]


class SpecError(RlxError):
    """The config stored in ``RunStarted`` lacks a value the controller needs, or has a bad one."""


class ControllerSpec(NamedTuple):
    """The scheduling parameters of a run (see ``runtime.config`` for their meaning)."""

    seed: int
    steps: int
    dataset_size: int
    group_size: int
    groups_per_batch: int
    mode: str
    max_staleness: int
    filter_groups: bool
    max_groups_per_batch: int
    keep_newest: int
    sampling: dict
    keep_every: int = 0
    eval_every: int = 0
    draw_ahead: int = 0

    def evaluated(self, version: int) -> bool:
        """Whether ``version`` is due for held-out evaluation (``eval.every_steps``): every N-th
        version from version 0 on, and the run's final version; none when N is 0."""
        n = self.eval_every
        return n > 0 and 0 <= version <= self.steps and (version % n == 0 or version == self.steps)

    def kept(self, version: int) -> bool:
        """Whether retention keeps ``version`` for good (``params.keep_every``).

        With ``keep_every = N > 0`` every N-th version ``K`` is a checkpoint a replay can re-train
        from. The steps after ``K`` recompute old log-probs with the versions their rollouts were
        sampled from, up to ``max_staleness`` versions back, so the ``max_staleness`` versions
        before ``K`` are kept with it: a replay from ``K`` reads exactly what the run read.
        Version 0 is kept whatever this says.
        """
        n = self.keep_every
        if n <= 0 or version <= 0:
            return False
        checkpoint = -(-version // n) * n  # the first multiple of n at or after version
        return checkpoint - version <= self.max_staleness

    def kept_through(self, version: int) -> int:
        """How many versions in ``1..version`` :meth:`kept` keeps, counted without a scan."""
        n, k = self.keep_every, self.max_staleness
        if n <= 0 or version <= 0:
            return 0
        if k >= n - 1:  # the windows of consecutive checkpoints touch: every version is kept
            return version
        return version // n * (k + 1) + max(0, version % n - n + k + 1)

    @property
    def batch_rollouts(self) -> int:
        """Rollouts per batch: groups per batch × samples per group."""
        return self.groups_per_batch * self.group_size

    def batch_version(self, batch: int) -> int:
        """Deterministic mode: the version batch ``batch`` is sampled from, ``max(0, s-1-k)``."""
        return max(0, batch - 1 - self.max_staleness)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], seed: int) -> ControllerSpec:
        """The spec of a resolved config dict (the ``config`` of ``RunStarted``).

        Each section it reads is checked by that section's own class (``runtime.config``);
        fields this code version does not know are left aside, so older ledgers still fold.
        """
        from runtime.config import SECTIONS, ConfigError

        def section(name: str):
            table = config.get(name) if isinstance(config, Mapping) else None
            if not isinstance(table, Mapping):
                raise SpecError(f"the run's config has no {name} section")
            cls_ = SECTIONS[name]
            known = {f.name for f in dataclasses.fields(cls_)}
            try:
                return cls_(**{k: v for k, v in table.items() if k in known})
            except ConfigError as e:
                raise SpecError(f"the run's config: {e}") from None

        run, data, sampling, scheduling, params = map(section, ("run", "data", "sampling", "scheduling", "params"))
        # A run recorded before evaluation existed has no eval section: it evaluates nothing.
        evaluation = section("eval") if isinstance(config, Mapping) and "eval" in config else None
        unset = [name for name, value in (("data.size", data.size),
                                          ("scheduling.filter_groups", scheduling.filter_groups),
                                          ("scheduling.max_groups_per_batch", scheduling.max_groups_per_batch))
                 if value is None]
        if unset:
            raise SpecError(f"the run's config leaves {', '.join(unset)} unset (store the resolved config)")
        return cls(
            seed=int(seed),
            steps=run.steps,
            dataset_size=data.size,
            group_size=sampling.group_size,
            groups_per_batch=scheduling.groups_per_batch,
            mode=scheduling.mode,
            max_staleness=scheduling.max_staleness,
            filter_groups=scheduling.filter_groups,
            max_groups_per_batch=scheduling.max_groups_per_batch,
            keep_newest=params.keep_newest,
            sampling=sampling.request(),
            keep_every=params.keep_every,
            eval_every=0 if evaluation is None else evaluation.every_steps,
            draw_ahead=scheduling.draw_ahead or 0,
        )
