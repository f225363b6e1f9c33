"""The error raised when an objective, estimator or aggregation is configured wrongly."""

from __future__ import annotations

from collections.abc import Iterable


class ObjectiveConfigError(ValueError):
    """A user's mistake in configuring a loss, an advantage estimator or an aggregation.

    The message is one line that names the rejected value and what would be accepted.
    """


def reject(what: str, value: object, accepted: Iterable[object]) -> ObjectiveConfigError:
    """Builds the error for ``value`` of ``what`` not being one of ``accepted``."""
    listed = ", ".join(str(a) for a in accepted)
    return ObjectiveConfigError(f"unknown {what} {value!r}; accepted: {listed}")
