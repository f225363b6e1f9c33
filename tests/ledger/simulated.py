"""A small, real run history for the ledger tools' tests: the controller with simulated workers."""

from __future__ import annotations


def write_simulated_run(store, *, steps: int = 3, run_id: str = "sim") -> str:
    """Write run ``run_id`` of ``steps`` steps (4 groups of 4 rollouts each) into ``store``."""
    from runtime.config import load_config
    from runtime.controller.loop import ControllerLoop
    from runtime.controller.simulation import run_to_end

    config = load_config(None, [f"run.steps={steps}", "sampling.group_size=4", "scheduling.groups_per_batch=4"],
                         data_size=50)
    loop = ControllerLoop.create(store, run_id=run_id, config=config.to_dict(), config_digest=config.digest(),
                                 seed=config.run.seed, fingerprint={})
    run_to_end(loop, workers=2, slots=4)
    return run_id
