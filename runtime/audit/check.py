"""``rlx audit check``: invariants I1–I8 over a whole run, with the parameter store's view of I8.

Pure: the caller reads the parameter store (each stored version's digest recomputed from its
arrays, or why it could not be read) and passes the result in. Beyond
``runtime.controller.invariants.check``, which compares stored digests with the ledger, a
version the ledger still retains (published, never retired) but the store lacks is an I8
violation: the run could not resume from it, and nothing could audit its bits. A parameter
store that is gone altogether lacks every retained version: that is a violation too, not a
reason to check the ledger alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ledger.store import StoredEvent
from runtime.audit.provenance import Provenance
from runtime.controller.invariants import NAMES, Violation, check

__all__ = ["NAMES", "Violation", "check_run"]


def check_run(events: Iterable[StoredEvent], *, stored: Mapping[int, str] | None = None,
              unreadable: Mapping[int, str] | None = None, absent: str | None = None,
              vocab_size: int | None = None) -> list[Violation]:
    """Every violation of I1–I9 in a run, in ledger order.

    Args:
      events: the run's stored events, in seq order.
      stored: digest of every readable version in the run's parameter store; None to check the
        ledger alone (a caller that has no parameter store to compare with).
      unreadable: versions present in the store whose data could not be read, with the reason.
      absent: why the run's parameter store could not be read at all (it does not exist, it
        cannot be opened); every version the ledger retains is then missing from it.
      vocab_size: the run's model's vocabulary size (I9); None: token ids only checked to be >= 0.
    """
    events = list(events)
    unreadable = dict(unreadable or {})
    if absent is not None:
        stored, unreadable = {}, {}
    digest_of = None if stored is None else stored.get
    why = "" if absent is None else f" ({absent})"
    out = check(events, digest_of=digest_of, vocab_size=vocab_size)
    if stored is not None:
        for v, seq in Provenance.from_events(events).retained().items():
            if v in unreadable:
                out.append(Violation("I8", seq, f"stored version {v} is unreadable: {unreadable[v]}"))
            elif v not in stored:
                out.append(Violation("I8", seq, f"version {v} is retained by the ledger but missing from the "
                                                f"parameter store{why}"))
    return sorted(out, key=lambda x: (x.seq, x.invariant))
