"""``rlx audit check``: invariants I1–I8 over a whole run, with the parameter store's view of I8.

Pure: the caller reads the parameter store (each stored version's digest recomputed from its
arrays, or why it could not be read) and passes the result in. Beyond
``runtime.controller.invariants.check``, which compares stored digests with the ledger, a
version the ledger still retains (published, never retired) but the store lacks is an I8
violation: the run could not resume from it, and nothing could audit its bits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ledger.store import StoredEvent
from runtime.audit.provenance import Provenance
from runtime.controller.invariants import NAMES, Violation, check

__all__ = ["NAMES", "Violation", "check_run"]


def check_run(events: Iterable[StoredEvent], *, stored: Mapping[int, str] | None = None,
              unreadable: Mapping[int, str] | None = None) -> list[Violation]:
    """Every violation of I1–I8 in a run, in ledger order.

    Args:
      events: the run's stored events, in seq order.
      stored: digest of every readable version in the run's parameter store; None when the run
        has no parameter store to check (the ledger is then checked alone).
      unreadable: versions present in the store whose data could not be read, with the reason.
    """
    events = list(events)
    unreadable = dict(unreadable or {})
    digest_of = None if stored is None else stored.get
    out = check(events, digest_of=digest_of)
    if stored is not None:
        for v, seq in Provenance.from_events(events).retained().items():
            if v in unreadable:
                out.append(Violation("I8", seq, f"stored version {v} is unreadable: {unreadable[v]}"))
            elif v not in stored:
                out.append(Violation("I8", seq, f"version {v} is retained by the ledger but missing from the parameter store"))
    return sorted(out, key=lambda x: (x.seq, x.invariant))
