"""What the controller needs to know of a run's config, read from the dict in ``RunStarted``.

The controller reads the stored, resolved config (``runtime.config.Config.to_dict``) rather
than importing the config classes' validation, which checks the algorithm against the JAX
kernels' registry: folding a ledger needs neither JAX nor the software that wrote it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from runtime.errors import RlxError

DETERMINISTIC = "deterministic"
FRESHEST = "freshest"


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

    @property
    def batch_rollouts(self) -> int:
        """Rollouts per batch: groups per batch × samples per group."""
        return self.groups_per_batch * self.group_size

    def batch_version(self, batch: int) -> int:
        """Deterministic mode: the version batch ``batch`` is sampled from, ``max(0, s-1-k)``."""
        return max(0, batch - 1 - self.max_staleness)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], seed: int) -> ControllerSpec:
        """The spec of a resolved config dict (the ``config`` of ``RunStarted``)."""

        def get(section: str, field: str, kind: type) -> Any:
            try:
                value = config[section][field]
            except (KeyError, TypeError):
                raise SpecError(f"the run's config has no {section}.{field}") from None
            if kind is int and (type(value) is not int):
                raise SpecError(f"the run's config has {section}.{field}={value!r}; an integer is needed")
            if kind is bool and type(value) is not bool:
                raise SpecError(
                    f"the run's config has {section}.{field}={value!r}; true or false is needed "
                    "(store the resolved config)"
                )
            return value

        def positive(section: str, field: str) -> int:
            value = get(section, field, int)
            if value < 1:
                raise SpecError(f"the run's config has {section}.{field}={value!r}; it must be >= 1")
            return value

        mode = get("scheduling", "mode", str)
        if mode not in (DETERMINISTIC, FRESHEST):
            raise SpecError(f"the run's config has scheduling.mode={mode!r}; accepted: {DETERMINISTIC}, {FRESHEST}")
        staleness = get("scheduling", "max_staleness", int)
        if staleness < 0:
            raise SpecError(f"the run's config has scheduling.max_staleness={staleness!r}; it must be >= 0")
        sampling = config.get("sampling", {})
        groups = positive("scheduling", "groups_per_batch")
        cap = positive("scheduling", "max_groups_per_batch")
        if cap < groups:
            raise SpecError(f"scheduling.max_groups_per_batch={cap} is below groups_per_batch={groups}")
        return cls(
            seed=int(seed),
            steps=positive("run", "steps"),
            dataset_size=positive("data", "size"),
            group_size=positive("sampling", "group_size"),
            groups_per_batch=groups,
            mode=mode,
            max_staleness=staleness,
            filter_groups=get("scheduling", "filter_groups", bool),
            max_groups_per_batch=cap,
            keep_newest=positive("params", "keep_newest"),
            sampling={k: sampling[k] for k in ("temperature", "top_p", "top_k", "max_tokens") if k in sampling},
        )
