"""Every event kind is classified and handled by each reader of the ledger.

A new kind must be placed by the fold (input or decision, with a handler), the audit (checked,
or named with the reason it needs no check) and the export (exported, or named with its reason):
otherwise an event could enter the ledger that a reader silently skips.
"""

from __future__ import annotations

import pytest

from ledger import events as ev
from ledger import open_store
from runtime.controller import invariants
from runtime.controller.admit import DECISION_KINDS, INPUT_KINDS
from runtime.controller.reduce import _HANDLERS

KINDS = frozenset(cls for cls in vars(ev).values() if isinstance(cls, type) and issubclass(cls, ev.Event)
                  and cls is not ev.Event and ev.EVENTS.current.get(getattr(cls, "KIND", None), (None,))[0] is cls)


def test_the_registry_is_what_the_module_defines():
    assert len(KINDS) == len(ev.EVENTS.current) >= 16


def test_the_fold_classifies_and_handles_every_kind():
    assert INPUT_KINDS | DECISION_KINDS == KINDS and not INPUT_KINDS & DECISION_KINDS
    assert set(_HANDLERS) == KINDS


def test_the_audit_checks_or_names_every_kind():
    assert invariants.AUDITED | set(invariants.NOT_AUDITED) == KINDS
    assert not invariants.AUDITED & set(invariants.NOT_AUDITED)
    assert all(reason for reason in invariants.NOT_AUDITED.values())


def test_the_export_reads_or_names_every_kind_and_says_so_truly():
    rollouts = pytest.importorskip("ledger.pipelines.rollouts")
    assert rollouts.EXPORTED | set(rollouts.NOT_EXPORTED) == KINDS
    assert not rollouts.EXPORTED & set(rollouts.NOT_EXPORTED)
    from tests.ledger.simulated import write_simulated_run

    with open_store("memory://") as store:
        run = write_simulated_run(store, steps=3)
        events = [(s.seq, s.event) for s in store.read(run)]
    seen = set()
    for item in events:
        kind = type(item[1])
        seen.add(kind)
        facts = [*rollouts._facts(item), *rollouts._step_facts(item)]
        assert bool(facts) == (kind in rollouts.EXPORTED), kind.KIND
    assert len(seen) >= 10  # the run exercised most kinds
