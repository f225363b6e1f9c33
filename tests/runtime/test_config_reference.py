"""The config reference (configs/REFERENCE.md) is generated from the config's declarations, and the
example config (configs/example.toml) is a valid config that covers every section."""

from __future__ import annotations

import dataclasses
import pathlib
import re
import tomllib

import pytest

from runtime import config as cfg
from runtime.config_reference import field_docs, reference, toml_value, undescribed

ROOT = pathlib.Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "configs" / "REFERENCE.md"
EXAMPLE = ROOT / "configs" / "example.toml"


def test_every_field_has_a_description():
    assert undescribed() == []
    assert field_docs(cfg.RunConfig)["steps"] == "Training steps (weight versions after version 0) the run makes."


def test_the_checked_in_reference_is_the_generated_one():
    assert REFERENCE.read_text(encoding="utf-8") == reference(), (
        "configs/REFERENCE.md is stale: regenerate it with `rlx config reference --out configs/REFERENCE.md`")


def test_the_reference_lists_each_field_with_its_type_and_default():
    text = reference()
    rows = re.findall(r"^\| `(\w+)` \| `([^`]*)` \| `([^`]*)` \| (.*) \|$", text, re.M)
    assert len(rows) == sum(len(dataclasses.fields(c)) for c in cfg.SECTIONS.values())
    for name in cfg.SECTIONS:
        assert f"## `[{name}]`" in text
    by_field = {r[0]: r for r in rows if r[0] in ("steps", "dtype", "mesh", "filter_groups")}
    assert by_field["dtype"][1:3] == ("str", '"float32"')
    assert by_field["filter_groups"][1:3] == ("bool \\| None", "unset")
    assert ("| `steps` | `int` | `1800` |" in text) and ("| `steps` | `int` | `265` |" in text)  # run, pretrain
    assert "| `mesh` | `dict` | `{}` |" in text


@pytest.mark.parametrize("value, written", [(None, "unset"), (True, "true"), ("a\"b", '"a\\"b"'), (0.08, "0.08"),
                                            ({"fsdp": 2}, "{fsdp = 2}")])
def test_defaults_are_written_as_toml(value, written):
    assert toml_value(value) == written


def test_the_command_prints_the_reference(capsys, tmp_path):
    from runtime.cli import main

    assert main(["config", "reference"]) == 0
    assert capsys.readouterr().out == reference()
    out = tmp_path / "ref.md"
    assert main(["config", "reference", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == reference()


def test_the_example_config_is_valid_and_covers_every_section(capsys):
    from runtime.cli import main
    from runtime.session import make_task

    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    assert sorted(data) == sorted(cfg.SECTIONS)  # a commented table for every section
    config = cfg.load_config(EXAMPLE, ["run.steps=2"])
    assert config.run.steps == 2 and config.data.task == "arithmetic"
    assert make_task(config).train_size > 0
    assert main(["config", "check", str(EXAMPLE), "--set", "run.steps=2"]) == 0
    assert '"steps": 2' in capsys.readouterr().out


def test_config_check_refuses_a_bad_value_in_one_line(capsys):
    from runtime.cli import main

    assert main(["config", "check", str(EXAMPLE), "--set", "sampling.top_p=2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sampling.top_p: 2.0 is not accepted; it must be in (0, 1]" in err


ADDED_SINCE = {"verifier": ("reward", "reward_digest"), "scheduling": ("draw_ahead",), "trainer": ("exact_logprobs",),
               "inference": ("admission",)}
"""Fields added after ``DEFAULT_DIGEST`` was taken, each unset by default."""
SECTIONS_ADDED_SINCE = {"episodes": ("tools", ())}
"""Sections added after ``DEFAULT_DIGEST`` was taken, with the field whose default leaves them off."""
DEFAULT_DIGEST = "6b2e303e87ef7fec736eb950b6f212d3c0c36ea87b0369dd5ad653d937ce8c36"


def test_descriptions_change_no_default():
    """The default config, less the fields added since, has the digest it had before the fields
    were described: a description is a docstring, never a value. A new field is listed in
    ``ADDED_SINCE`` with its unset default; a changed default fails here."""
    d = cfg.Config().to_dict()
    for section, off in SECTIONS_ADDED_SINCE.items():
        assert d.pop(section)[off[0]] == off[1]  # a section added since does nothing by default
    for section, names in ADDED_SINCE.items():
        for name in names:
            assert d[section].pop(name) is None
    assert cfg.config_digest(d) == DEFAULT_DIGEST
