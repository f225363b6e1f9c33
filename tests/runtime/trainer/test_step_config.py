"""``StepConfig.of``: the train step's config is derived from the ``trainer`` section, not copied.

Every field of the step that mirrors a field of the section takes the section's value, and its
default is the section's default (an unset section field, None, reads as the step's default), so
that the two cannot drift apart. The section's fields the step does not mirror are its device
layout, which the trainer's builder turns into the step's ``fixed_order_mesh``, and
``completion_logits``, which it turns into a ``completion_window`` of ``sampling.max_tokens``.
"""

from __future__ import annotations

import dataclasses

from kernels.algorithms import configure
from runtime.config import TrainerConfig, load_config
from runtime.session import step_config
from runtime.trainer.optimizer import OptimizerConfig
from runtime.trainer.step import SECTION_FIELDS, StepConfig
from tests.runtime.trainer.test_step import MODEL

OBJECTIVE = configure("grpo", group_size=4)
# Every mirrored field off its default, in two sections (a shared prefix excludes memory bounds).
BOUNDED = TrainerConfig(learning_rate=3e-3, weight_decay=0.01, max_grad_norm=0.5, warmup_steps=7,
                        micro_batch_size=2, logits_chunk=16, remat=True, shared_prefix=False,
                        old_logprobs="behaviour", prefix_per_octave=2)
SHARED = TrainerConfig(learning_rate=5e-5, shared_prefix=True, old_logprobs="recompute", prefix_per_octave=4)
PACKED = TrainerConfig(pack=True, shared_prefix=False, old_logprobs="behaviour", prefix_per_octave=1)


def _step(trainer: TrainerConfig) -> StepConfig:
    return StepConfig.of(trainer, model=MODEL, objective=OBJECTIVE, temperature=0.7, group_size=4)


def test_the_step_mirrors_every_trainer_field_but_the_device_layout():
    assert SECTION_FIELDS["share_prefix"] == "shared_prefix"  # the one field named otherwise
    assert all(name == section_name for name, section_name in SECTION_FIELDS.items() if name != "share_prefix")
    section = {f.name for f in dataclasses.fields(TrainerConfig)}
    assert section - set(SECTION_FIELDS.values()) == {"mesh", "deterministic_reduction", "completion_logits",
                                                      "exact_logprobs"}


def test_every_mirrored_field_defaults_to_the_sections_default():
    step_fields = {f.name: f for f in dataclasses.fields(StepConfig)}
    for name, section_name in SECTION_FIELDS.items():
        default = TrainerConfig.__dataclass_fields__[section_name].default
        if default is not None:  # None: unset, which reads as the step's default (next test)
            assert step_fields[name].default == default and type(step_fields[name].default) is type(default), name
    assert _step(TrainerConfig()) == StepConfig(model=MODEL, objective=OBJECTIVE, temperature=0.7, group_size=4)
    section = TrainerConfig()
    assert StepConfig(model=MODEL, objective=OBJECTIVE).optimizer == OptimizerConfig(
        learning_rate=section.learning_rate, weight_decay=section.weight_decay,
        max_grad_norm=section.max_grad_norm, warmup_steps=section.warmup_steps,
    )


def test_an_unset_field_reads_as_a_run_logged_before_it_existed():
    step = _step(TrainerConfig(shared_prefix=None, old_logprobs=None))
    assert step.share_prefix is False and step.old_logprobs == "recompute"


def test_every_mirrored_field_takes_the_sections_value():
    default = StepConfig(model=MODEL, objective=OBJECTIVE)
    moved = set()
    for section in (BOUNDED, SHARED, PACKED):
        step = _step(section)
        for name, section_name in SECTION_FIELDS.items():
            assert getattr(step, name) == getattr(section, section_name), name
            if getattr(step, name) != getattr(default, name):
                moved.add(name)
        assert (step.model, step.objective, step.temperature, step.group_size) == (MODEL, OBJECTIVE, 0.7, 4)
    assert moved == set(SECTION_FIELDS)  # each field was checked off its default at least once


def test_a_runs_step_is_its_configs():
    config = load_config(None, ["trainer.learning_rate=0.003", "trainer.warmup_steps=5", "sampling.temperature=0.5",
                                "sampling.group_size=4"])
    model = type("M", (), {"config": MODEL})()
    step = step_config(config, model)
    assert step == dataclasses.replace(
        StepConfig.of(config.trainer, model=MODEL, objective=config.objective(), temperature=0.5, group_size=4),
        completion_window=config.max_tokens)
    assert (step.learning_rate, step.warmup_steps, step.share_prefix, step.old_logprobs) == (0.003, 5, True, "behaviour")
    assert step.completion_window == config.max_tokens > 0


def test_the_completion_window_is_the_runs_max_tokens_unless_the_step_bounds_its_memory_or_predates_it():
    model = type("M", (), {"config": MODEL})()
    assert step_config(load_config(None, ["sampling.max_tokens=7"]), model).completion_window == 7
    assert step_config(load_config(None, ["trainer.micro_batch_size=4"]), model).completion_window == 0
    assert step_config(load_config(None, ["trainer.completion_logits=false"]), model).completion_window == 0
    logged_before = load_config(None).resolved()
    logged_before = dataclasses.replace(logged_before, trainer=dataclasses.replace(logged_before.trainer,
                                                                                   completion_logits=None))
    assert step_config(logged_before, model).completion_window == 0
