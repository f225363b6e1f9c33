"""Worker processes SIGKILLed at random moments: the run goes on and ends where an uninterrupted
one does, with every acknowledged event recorded once.

The runs and the kills are ``scripts/chaos.py``'s (imported as a module): a tiny model on
two-digit sums in processes mode, whose ``rlx worker`` children of every role are killed, each
role again only after its replacement delivered work.
"""

from __future__ import annotations

import pytest

from tests.scripts.script_module import load_script

chaos = load_script("chaos")


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    """The chaos config (16 steps); the warm start is cached for the whole session."""
    root = tmp_path_factory.mktemp("chaos")
    return chaos.prepare(str(root), steps=16, seed=1, cache_dir=str(tmp_path_factory.getbasetemp() / "warm_start"))


def _log(message: str) -> None:
    print(message, flush=True)


@pytest.mark.slow
def test_killed_workers_of_every_role_leave_the_final_digest_of_an_uninterrupted_run(config, tmp_path):
    killed = str(tmp_path / "killed")
    summary, kills = chaos.run_with_kills(config, killed, kills=10, seed=16, max_gap_s=0.5, log=_log)
    assert len(kills) >= 10, [(k.role, k.worker_id) for k in kills]
    assert {k.role for k in kills} == set(chaos.ROLES)
    assert all(k.recovery_s is not None for k in kills[:-3])  # the last ones may fall after the run's end
    threads = chaos.run_plain(config, str(tmp_path / "threads"), mode="threads")
    assert summary["final_digest"] == threads["final_digest"]
    assert summary["final_version"] == threads["final_version"] == 16
    assert chaos.ledger_violations(killed) == []
    assert chaos.audit_ok(killed)


@pytest.mark.slow
def test_a_freshest_mode_run_with_killed_workers_finishes_replays_bit_exactly_and_passes_the_audit(config, tmp_path):
    killed = str(tmp_path / "freshest")
    summary, kills = chaos.run_with_kills(config, killed, kills=3, seed=7, max_gap_s=0.5,
                                          overrides=['scheduling.mode="freshest"'], log=_log)
    assert len(kills) == 3 and summary["final_version"] == 16
    assert chaos.ledger_violations(killed) == []
    assert chaos.audit_ok(killed)
    assert chaos.replay_ok(killed, regenerate=True)
