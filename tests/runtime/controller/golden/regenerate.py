"""Write the golden ledgers of the replay tests: ``python -m tests.runtime.controller.golden.regenerate``.

Each golden history is a short simulated run, exported as one ``.msgpack`` file: a msgpack array
of ``[kind, version, body]`` records, ``body`` being the event's canonical bytes as the ledger
stores them. ``altered.msgpack`` is the deterministic history with one decision edited (a
rollout's seed), which replay must reject. ``v1_deterministic_k1.msgpack`` is the
deterministic history as written when ``RolloutRequested`` and ``RolloutAssigned`` named one
rollout each (schema version 1); it is not regenerated.

Regenerate only when the event vocabulary or the controller's decisions change on purpose: the
point of the files is that replay of old histories keeps working.
"""

from __future__ import annotations

import dataclasses
import pathlib

import msgpack

from ledger import events as ev
from ledger import open_store
from ledger.codec import decode_body, encode_event
from runtime.config import load_config
from runtime.controller.loop import ControllerLoop
from runtime.controller.simulation import run_to_end

HERE = pathlib.Path(__file__).resolve().parent

RUNS = {
    "deterministic_k1": ["scheduling.mode=deterministic", "scheduling.max_staleness=1"],
    "deterministic_k0_filtered": ["scheduling.mode=deterministic", "scheduling.max_staleness=0",
                                  "scheduling.filter_groups=true"],
    "freshest_k1_filtered": ["scheduling.mode=freshest", "scheduling.max_staleness=1",
                             "scheduling.filter_groups=true"],
}
# Every value the controller reads is pinned, so that new config fields or defaults leave the
# histories' decisions unchanged (only RunStarted's stored config would differ).
COMMON = ["run.steps=4", "run.seed=7", "sampling.group_size=3", "scheduling.groups_per_batch=2",
          "scheduling.max_groups_per_batch=8", "params.keep_newest=2", "sampling.temperature=1.0",
          "sampling.top_p=1.0", "sampling.top_k=0", "sampling.max_tokens=64"]


def simulate(overrides: list[str]) -> list[ev.Event]:
    config = load_config(None, COMMON + overrides, data_size=10)
    store = open_store("memory://")
    loop = ControllerLoop.create(store, run_id="golden", config=config.to_dict(), config_digest=config.digest(),
                                 seed=config.run.seed, fingerprint={"python": "3.11"})
    run_to_end(loop, workers=2, slots=2)
    return store.events("golden")


def dump(events: list[ev.Event], path: pathlib.Path) -> None:
    path.write_bytes(msgpack.packb([list(encode_event(e)) for e in events], use_bin_type=True))


def load(path: pathlib.Path) -> list[ev.Event]:
    """The events of a golden file (decoded, and upcast if they were written by older software)."""
    return [decode_body(kind, version, body) for kind, version, body in msgpack.unpackb(path.read_bytes(), raw=False)]


def altered(events: list[ev.Event]) -> tuple[list[ev.Event], int]:
    """``events`` with the seed of the fifth group's second sample changed; returns its seq too."""
    out = list(events)
    index = [i for i, e in enumerate(out) if isinstance(e, ev.RolloutRequested)][4]
    seeds = out[index].seeds
    out[index] = dataclasses.replace(out[index], seeds=(seeds[0], seeds[1] + 1, *seeds[2:]))
    return out, index + 1


def main() -> None:
    for name, overrides in RUNS.items():
        dump(simulate(overrides), HERE / f"{name}.msgpack")
    bad, _ = altered(load(HERE / "deterministic_k1.msgpack"))
    dump(bad, HERE / "altered.msgpack")


if __name__ == "__main__":
    main()
