"""Every config field has a consumer.

The resolved config is the first event of every run: a field that nothing reads would be a false
provenance record (the ledger would say a run was made with a setting that changed nothing). The
test runs a small run with every read of a config field recorded, and requires each field to be
read by the code that builds or runs the run — not only by the config's own validation,
resolution and serialisation.
"""

from __future__ import annotations

import dataclasses
import sys

import pytest

from runtime import config as cfg

# Reads that are not consumption: the config checking, resolving, printing or encoding itself.
_NOT_CONSUMERS = {
    "__post_init__", "check", "_at_least", "_choice", "resolved", "to_dict", "digest", "__eq__", "__hash__",
    "__repr__", "_asdict_inner", "asdict", "replace", "_replace",
}


@pytest.fixture
def field_reads(monkeypatch):
    """The ``section.field`` names read, while the fixture is active, outside ``_NOT_CONSUMERS``."""
    fields = {cls: {f.name for f in dataclasses.fields(cls)} for cls in cfg.SECTIONS.values()}
    reads: set[str] = set()
    get = object.__getattribute__

    def recording(self, name):
        value = get(self, name)
        names = fields.get(type(self))
        if names is not None and name in names and sys._getframe(1).f_code.co_name not in _NOT_CONSUMERS:
            reads.add(f"{type(self).NAME}.{name}")
        return value

    monkeypatch.setattr(cfg.Section, "__getattribute__", recording)
    return reads


def all_fields() -> set[str]:
    return {f"{name}.{f.name}" for name, cls in cfg.SECTIONS.items() for f in dataclasses.fields(cls)}


def test_the_recorder_sees_reads_and_ignores_validation(field_reads):
    c = cfg.SamplingConfig(max_tokens=3)  # checks every field in __post_init__: not consumption
    assert field_reads == set()
    assert c.max_tokens == 3
    assert field_reads == {"sampling.max_tokens"}


@pytest.mark.slow
def test_every_config_field_is_read_by_a_run(tmp_path, field_reads):
    import json

    from ledger import open_store
    from runtime.run import resume, run
    from tests.runtime.small_run import tiny_config, write_sums

    data = tmp_path / "mixed.jsonl"  # sums for the math verifier and an echo for the code sandbox
    write_sums(data)
    with open(data, "a", encoding="utf-8") as f:
        f.write(json.dumps({"prompt": "echo", "tests": [{"input": "hi\n", "output": "hi\n"}]}) + "\n")
    config = tiny_config(str(data), str(tmp_path / "warm_start"))
    config = dataclasses.replace(config, run=dataclasses.replace(config.run, steps=1),
                                 pretrain=dataclasses.replace(config.pretrain, steps=5))
    out = str(tmp_path / "run")
    run(config, out, progress=False, log=lambda m: None)
    assert resume(out, progress=False, log=lambda m: None) is None  # finished: read back, nothing to do
    # and a run of multi-turn episodes with a calculator (the episodes section), resumed the same way
    tools = dataclasses.replace(config, episodes=cfg.EpisodesConfig(tools=("calculator",), turn_tokens=8),
                                sampling=dataclasses.replace(config.sampling, max_tokens=24))
    run(tools, str(tmp_path / "tools"), progress=False, log=lambda m: None)
    assert resume(str(tmp_path / "tools"), progress=False, log=lambda m: None) is None
    unread = sorted(all_fields() - field_reads)
    assert unread == [], f"config fields nothing reads: {unread}"
    with open_store(out) as store:
        started = next(store.read("run", 1, 1)).event
    assert "isolation namespaces" in started.fingerprint["sandbox"]  # the isolation that judged the run
