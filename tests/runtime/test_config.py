"""Run configuration: TOML, overrides, validation messages, resolution and digest."""

from __future__ import annotations

import pytest

from runtime.config import Config, ConfigError, apply_overrides, config_digest, load_config, parse_override


def test_defaults_are_valid_and_resolved():
    c = load_config()
    assert c.scheduling.mode == "deterministic" and c.scheduling.max_staleness == 1
    assert c.scheduling.filter_groups is False  # grpo has no dynamic sampling
    assert c.scheduling.max_groups_per_batch == 4 * c.scheduling.groups_per_batch


def test_toml_file_and_overrides(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[run]\nsteps = 3\n[algorithm]\nname = "dapo"\n[algorithm.options]\nclip_high = 0.3\n')
    c = load_config(path, ["scheduling.mode=freshest", "scheduling.max_staleness=2", "model.path=/a/b"], data_size=9)
    assert (c.run.steps, c.scheduling.mode, c.scheduling.max_staleness) == (3, "freshest", 2)
    assert c.algorithm.options == {"clip_high": 0.3} and c.model.path == "/a/b" and c.data.size == 9
    assert c.scheduling.filter_groups is True  # from dapo's dynamic sampling
    assert c.objective().clip_high == 0.3


def test_override_values_are_read_as_toml():
    assert parse_override("a.b=2") == (("a", "b"), 2)
    assert parse_override("a.b=0.5") == (("a", "b"), 0.5)
    assert parse_override("a.b=true") == (("a", "b"), True)
    assert parse_override("a.b=/x/y") == (("a", "b"), "/x/y")
    assert apply_overrides({"algorithm": {"name": "grpo"}}, ["algorithm.options.kl_coef=0.1"]) == {
        "algorithm": {"name": "grpo", "options": {"kl_coef": 0.1}}}


@pytest.mark.parametrize("override, message", [
    ("scheduling.mode=fresh", "scheduling.mode: 'fresh' is not accepted; accepted: deterministic, freshest"),
    ("inference.admission=longest", "inference.admission: 'longest' is not accepted; accepted: prompt_length, arrival"),
    ("scheduling.max_staleness=-1", "scheduling.max_staleness: -1 is not accepted; it must be >= 0"),
    ("scheduling.max_staleness=1.5", "scheduling.max_staleness: 1.5 is not accepted; it must be an integer"),
    ("algorithm.name=foo", "algorithm.name: 'foo' is not accepted; accepted: reinforce, grpo"),
    ("algorithm.options.bogus=1", "unknown option 'bogus' for algorithm 'grpo'"),
    ("schedule.mode=x", "override section: 'schedule' is not accepted; accepted: run, model"),
    ("sampling.topp=1", "sampling field: 'topp' is not accepted; accepted: group_size"),
    ("sampling.top_p=0", "sampling.top_p: 0.0 is not accepted; it must be in (0, 1]"),
    ("run.steps=x", "run.steps: 'x' is not accepted; it must be an integer"),
    ("noequals", "override: 'noequals' is not accepted"),
    ("data.eval_fraction=0", "data.eval_fraction: 0.0 is not accepted; it must be in (0, 1)"),
    ("algorithm.options.value_coef=0.5", "algorithm.options.value_coef: 0.5 is not accepted; rlx run trains no value model"),
    ("ledger.synchronous=SOMETIMES", "ledger.synchronous: 'SOMETIMES' is not accepted; accepted: OFF, NORMAL, FULL, EXTRA"),
])
def test_bad_values_name_the_value_and_what_is_accepted(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert message in str(info.value) and "\n" not in str(info.value)


def test_algorithm_names_come_from_the_registry():
    from kernels.objectives import ALGORITHMS

    for name in ALGORITHMS:
        assert load_config(None, [f"algorithm.name={name}"]).algorithm.name == name


def test_digest_ignores_key_order_and_round_trips():
    c = load_config(None, ["run.seed=3"], data_size=5)
    d = c.to_dict()
    assert Config.from_dict(d) == c
    shuffled = {k: dict(reversed(list(v.items()))) for k, v in reversed(list(d.items()))}
    assert config_digest(shuffled) == c.digest()
    assert load_config(None, ["run.seed=4"], data_size=5).digest() != c.digest()


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


@pytest.mark.parametrize("field", ["ledger.url", "params.url"])
@pytest.mark.parametrize("url", ["postgresql://rlx:{s}@db.example/rl", "postgresql://rlx@db.example/rl?sslmode=require&password={s}",
                                 "gs://rlx:{s}@bucket/params"])
def test_store_urls_with_a_password_are_refused_without_echoing_it(tmp_path, capsys, field, url):
    """A secret in the config would enter the run's first ledger event forever: refused, one line,
    the secret masked, nothing created."""
    from runtime.cli import main

    secret = "hunter2-secret"
    out = tmp_path / "run"
    code = main(["run", "--out", str(out), "--set", f'{field}="{url.format(s=secret)}"'])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"{field}:" in err and "PGPASSWORD" in err
    assert secret not in err and not out.exists()
