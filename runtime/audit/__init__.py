"""Auditing a run from its ledger: the provenance of versions, rollouts and steps, and the
invariants I1–I8 (with the parameter store's view of I8)."""

from runtime.audit.check import NAMES, Violation, check_run
from runtime.audit.provenance import Provenance

__all__ = ["NAMES", "Provenance", "Violation", "check_run"]
