"""Retired config fields: a run's logged config that holds one still reads back; a new config that
sets one is refused in one line that says where the setting went."""

from __future__ import annotations

import pytest

from runtime.config import Config, ConfigError, load_config


def test_a_logged_config_with_a_retired_field_reads_back_without_it():
    logged = {**Config().to_dict()}
    logged["pretrain"] = {**logged["pretrain"], "eval_size": 500}  # as runs before the field was retired logged it
    config = Config.from_dict(logged)
    assert config == Config.from_dict(Config().to_dict()) and "eval_size" not in config.to_dict()["pretrain"]


def test_a_new_config_that_sets_a_retired_field_is_refused_with_where_it_went():
    with pytest.raises(ConfigError, match=r"pretrain.eval_size no longer exists: .*eval.size"):
        load_config(None, ["pretrain.eval_size=8"])
