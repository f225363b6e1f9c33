"""Which versions retention may evict: a pure decision, executed by ``ParamStore.retain``.

The store keeps the newest ``keep_newest`` versions (so a resume can always find the latest
weights) and every pinned version (I5: a version that an outstanding rollout request or a resume
needs is pinned by the controller). Everything else may go.
"""

from __future__ import annotations

from collections.abc import Iterable

from runtime.params.errors import ParamStoreError


def evictable(
    versions: Iterable[int], *, keep_newest: int, pinned: Iterable[int] = ()
) -> tuple[int, ...]:
    """The versions to evict, ascending.

    Args:
        versions: the published versions.
        keep_newest: how many of the newest versions to keep; at least 1.
        pinned: versions that must be kept whatever their age (unknown ones are ignored).

    Returns:
        Every version that is neither among the ``keep_newest`` largest nor pinned.
    """
    if isinstance(keep_newest, bool) or not isinstance(keep_newest, int) or keep_newest < 1:
        raise ParamStoreError(
            f"keep_newest={keep_newest!r} is not accepted; it must be an int >= 1 "
            "(the newest version is always kept)"
        )
    ordered = sorted(set(versions))
    newest = set(ordered[-keep_newest:])
    kept = newest | set(pinned)
    return tuple(v for v in ordered if v not in kept)
