"""Typed run configuration: one frozen dataclass per component, composed by :class:`Config`.

A config comes from a TOML file (``tomllib``) and ``--set section.field=value`` overrides, e.g.
``--set scheduling.mode=freshest``, ``--set scheduling.max_staleness=2``,
``--set algorithm.name=rloo`` or ``--set algorithm.options.clip_high=0.28``. Every section
checks its values in ``__post_init__``; a rejected value raises :class:`ConfigError` whose one
line names the field, the value and what is accepted. Algorithm names and options are checked
by the objective registry itself (``kernels.objectives``), never against a copy of its names.

The resolved config (every field explicit) is stored in ``RunStarted`` together with
:func:`config_digest`, the sha256 of its canonical msgpack encoding. The controller reads only
the fields it needs from that stored dict (``runtime.controller.spec``), so it never imports
JAX; the algorithm check, which imports the JAX kernels, runs once, when a config is loaded.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
import re
import tomllib
import typing
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

from runtime.errors import UsageError

MAX_CONFIG_BYTES = 1 << 20
NO_VALUE_MODEL = frozenset({"value_clip", "value_coef"})  # objective options only a critic would read
MAX_TOKENS = 1 << 16  # a completion longer than this is a mistake, not a setting
DETERMINISTIC = "deterministic"
FRESHEST = "freshest"
MODES = (DETERMINISTIC, FRESHEST)
OLD_LOGPROBS = ("recompute", "behaviour")  # trainer.old_logprobs
# Where a checkpoint's chat template can come from, in the order it is looked for (runtime.model.hf_text).
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")
MESH_AXES = ("data", "fsdp", "model")  # trainer.mesh
DEVICE_LAYOUTS = ("auto", "inherit")  # workers.devices, besides a table (runtime.placement)


class ConfigError(UsageError):
    """A bad config value, section, field or override; the message is one line."""


def _fail(where: str, value: Any, accepted: str) -> ConfigError:
    return ConfigError(f"{where}: {value!r} is not accepted; {accepted}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(where: str, value: Any, hint: Any) -> Any:
    """``value`` checked against a field annotation (int → float allowed), or ``ConfigError``."""
    args = typing.get_args(hint)
    if type(None) in args:
        if value is None:
            return None
        others = [a for a in args if a is not type(None)]
        if len(others) > 1:  # e.g. str | dict: the first that takes it
            for other in others:
                try:
                    return _coerce(where, value, other)
                except ConfigError:
                    pass
            raise _fail(where, value, "it must be " + " or ".join(
                {"str": "a string", "dict": "a table"}.get(getattr(o, "__name__", ""), str(o)) for o in others))
        (hint,) = others
    if hint is bool:
        if type(value) is bool:
            return value
        raise _fail(where, value, "it must be true or false")
    if hint is int:
        if type(value) is int:
            return value
        raise _fail(where, value, "it must be an integer")
    if hint is float:
        if type(value) in (int, float) and math.isfinite(value):
            return float(value)
        raise _fail(where, value, "it must be a finite number")
    if hint is str:
        if type(value) is str:
            return value
        raise _fail(where, value, "it must be a string")
    if hint is tuple:
        if isinstance(value, (list, tuple)) and all(type(v) is str for v in value):
            return tuple(value)
        raise _fail(where, value, "it must be a list of strings")
    if typing.get_origin(hint) is dict or hint is dict:
        if isinstance(value, Mapping) and all(type(k) is str for k in value):
            return dict(value)
        raise _fail(where, value, "it must be a table of named values")
    raise TypeError(f"unsupported config annotation {hint!r} for {where}")


def _redacted(url: str) -> str:
    """``url`` with the password of its user part and every ``password=`` query value masked."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = netloc.replace(":" + parts.password + "@", ":***@", 1)
    query = re.sub(r"(?i)(password=)[^&]*", r"\1***", parts.query)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))


def _without_credentials(where: str, url: str | None) -> None:
    """Refuse a store URL that carries a password: the resolved config is the run's first ledger
    event, hash-chained, exported and audited forever, so a secret in it could never be removed."""
    if url is None or "://" not in url:
        return
    try:
        parts = urllib.parse.urlsplit(url)
        secret = parts.password is not None or re.search(r"(?i)(^|&)password=", parts.query) is not None
    except ValueError:
        raise _fail(where, url, "it must be a well-formed URL") from None
    if secret:
        raise ConfigError(
            f"{where}: {_redacted(url)!r} carries a password, which would be recorded in the run's ledger; "
            "give the URL without it and the password through the environment (PGPASSWORD) or a password "
            "file (~/.pgpass or PGPASSFILE)"
        )


class Section:
    """Base of the config sections: type-checks every field, then runs ``check``."""

    NAME: typing.ClassVar[str]
    # Declared for the type checker: every section is a dataclass.
    __dataclass_fields__: typing.ClassVar[dict[str, dataclasses.Field[Any]]]

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            hint = _hints(type(self))[f.name]  # type: ignore[arg-type]  # a class is hashable (mypy#11470)
            value = _coerce(f"{self.NAME}.{f.name}", getattr(self, f.name), hint)
            object.__setattr__(self, f.name, value)
        self.check()

    def check(self) -> None:
        """Range and choice checks of the section's values."""

    def _at_least(self, field: str, low: float) -> None:
        value = getattr(self, field)
        if value is not None and value < low:
            raise _fail(f"{self.NAME}.{field}", value, f"it must be >= {low}")

    def _choice(self, field: str, accepted: Iterable[str]) -> None:
        value = getattr(self, field)
        accepted = tuple(accepted)
        if value not in accepted:
            raise _fail(f"{self.NAME}.{field}", value, "accepted: " + ", ".join(accepted))


@dataclasses.dataclass(frozen=True)
class RunConfig(Section):
    """The run: its name (the ledger's run id), master seed and number of training steps (at most
    ``MAX_STEPS``: a count no run reaches, so that a slip of the keyboard is refused, not run)."""

    MAX_STEPS = 10**9
    NAME = "run"
    name: str = "run"
    """The run's id in the ledger; a run directory or ledger holds each id once."""
    seed: int = 0
    """The master seed: every random draw of the run (prompts, sampling, initial weights, the held-out split) is
    derived from it."""
    steps: int = 1800
    """Training steps (weight versions after version 0) the run makes."""

    def check(self) -> None:
        if not self.name or len(self.name) > 200:
            raise _fail("run.name", self.name, "it must be a non-empty string of at most 200 characters")
        if not 0 <= self.seed < 2**63:
            raise _fail("run.seed", self.seed, "it must be an integer in [0, 2**63)")
        if not 1 <= self.steps <= self.MAX_STEPS:
            raise _fail("run.steps", self.steps, f"it must be an integer from 1 to {self.MAX_STEPS}")


@dataclasses.dataclass(frozen=True)
class ModelConfig(Section):
    """The policy: a local Hugging Face checkpoint directory, or None for the built-in model,
    a decoder of the given shape initialised with normal(0, ``initializer_range``) weights.
    The shape fields are named as ``runtime.model.ModelConfig``'s, which they become. The
    built-in default (about 0.6M parameters) is 3 layers of width 128 with 4 heads and a SwiGLU
    MLP of 344 (about 8/3 of the width, as Llama sizes it: the parameters of a 4x GELU MLP).

    ``dtype`` is the compute dtype of trainer and inference engine alike (``bfloat16``: bfloat16
    matmuls from float32 master weights and optimizer state; norms, softmax and log-probs stay
    float32), for the built-in model and a checkpoint alike."""

    NAME = "model"
    path: str | None = None
    """A local Hugging Face checkpoint directory (config.json, model.safetensors, tokenizer.json); unset: the
    built-in character-level decoder of the shape below."""
    hidden_size: int = 128
    """Width of the built-in model (its residual stream); ignored with a checkpoint."""
    num_layers: int = 3
    """Decoder layers of the built-in model."""
    num_heads: int = 4
    """Attention heads of the built-in model (hidden_size must be a multiple)."""
    num_kv_heads: int = 4
    """Key/value heads of the built-in model (grouped-query attention; num_heads must be a multiple)."""
    intermediate_size: int = 344
    """Width of the built-in model's SwiGLU MLP."""
    max_position_embeddings: int = 256
    """Positions of the built-in model: the longest prompt plus sampling.max_tokens must fit."""
    initializer_range: float = 0.08
    """Standard deviation of the built-in model's normal initial weights."""
    dtype: str = "float32"
    """Compute dtype of trainer and engine: float32, or bfloat16 (bfloat16 matmuls, float32 master weights)."""

    def check(self) -> None:
        from runtime.model.config import DTYPES

        self._choice("dtype", DTYPES)
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
                     "max_position_embeddings"):
            self._at_least(name, 1)
        if not self.initializer_range > 0.0:
            raise _fail("model.initializer_range", self.initializer_range, "it must be > 0")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise _fail("model.num_heads", self.num_heads,
                        "hidden_size must be a multiple of num_heads and num_heads of num_kv_heads")


@dataclasses.dataclass(frozen=True)
class PretrainConfig(Section):
    """The supervised warm start of the built-in model (0 steps: none; a ``model.path`` checkpoint
    is used as it is). The held-out evaluation before and after RL is the ``eval`` section's.

    The warm start trains with the RL step's optimizer (``runtime.trainer.optimizer``) at a
    constant ``learning_rate``, without clipping, and with optax's weight decay of 1e-4
    (``runtime.trainer.pretrain.warm_start_optimizer``). ``cache_dir`` (None:
    ``~/.cache/rlx/warm_start``) keeps finished warm starts by a digest of their inputs. The
    default of 265 steps leaves the demo's model at about a third of the held-out sums (34% with
    seed 0; 250 steps give 23%, 280 give 45%: the task has a sharp transition there), so RL has
    something to show.
    """

    NAME = "pretrain"
    steps: int = 265
    """Supervised warm-start steps of the built-in model before RL (0: none; a checkpoint is used as it is)."""
    batch_size: int = 128
    """Problems per warm-start step."""
    learning_rate: float = 1e-3
    """Constant learning rate of the warm start."""
    cache_dir: str | None = None
    """Where finished warm starts are kept by a digest of their inputs; unset: ~/.cache/rlx/warm_start."""

    def check(self) -> None:
        self._at_least("steps", 0)
        self._at_least("batch_size", 1)
        if self.learning_rate <= 0.0:
            raise _fail("pretrain.learning_rate", self.learning_rate, "it must be > 0")


@dataclasses.dataclass(frozen=True)
class DataConfig(Section):
    """The training prompts: a task name (checked by the task registry when data is loaded),
    an optional JSONL path, and ``size``, the number of training prompts, filled in from the
    loaded dataset before the run starts (the controller samples indices in ``[0, size)``).

    ``chat_template``: render every prompt with the checkpoint's chat template (``model.path``'s
    ``chat_template.jinja``, else ``chat_template.json``, else ``tokenizer_config.json``'s entry, as
    Transformers reads it); ``chat_template_digest`` and ``chat_template_file`` are filled in with
    the sha256 of that template and the file it came from when the run starts, and a replay or
    resume whose checkpoint's template differs is refused. ``max_prompt_tokens`` caps a prompt's tokens (None: the model's positions less
    ``sampling.max_tokens``); a prompt over the cap is an error naming it. Prompts are counted in
    the model's tokens, and the longest fixes the engine's prefill bucket and the batch width.

    ``task = "gym:<dataset>"`` draws problems from a reasoning-gym dataset (``runtime.tasks.gym``)
    whose config, with the task's ``train_size``, ``eval_size`` and ``system``, is ``options``;
    ``task_version`` is filled in with the installed reasoning-gym's version when the run starts,
    and a replay or resume under another version is refused.
    """

    NAME = "data"
    task: str = "arithmetic"
    """Where prompts come from and how they are scored: arithmetic, codefn, jsonl (data.path) or gym:<dataset>
    (reasoning-gym)."""
    path: str | None = None
    """A JSONL file of {prompt, answer} or {prompt, tests} rows (task jsonl), or codefn's rows."""
    size: int | None = None
    """Training prompts; filled in from the loaded task when the run starts."""
    eval_fraction: float = 0.1
    """Share of a JSONL file's rows held out for evaluation (chosen by the seed)."""
    chat_template: bool = False
    """Render each prompt with the checkpoint's chat template (needs model.path)."""
    chat_template_digest: str | None = None
    """sha256 of the chat template the run rendered prompts with; filled in when the run starts, checked on resume
    and replay."""
    chat_template_file: str | None = None
    """The checkpoint file the chat template came from; filled in when the run starts."""
    max_prompt_tokens: int | None = None
    """Most tokens a prompt may have (a longer one is an error naming it); unset: the model's positions less
    sampling.max_tokens."""
    options: dict = dataclasses.field(default_factory=dict)
    """A gym:<dataset> task's config (the dataset's own fields, train_size, eval_size, system)."""
    task_version: str | None = None
    """The installed version of the package the problems come from (reasoning-gym); filled in when the run starts,
    checked on resume and replay."""

    def check(self) -> None:
        self._at_least("size", 1)
        self._at_least("max_prompt_tokens", 1)
        if not 0.0 < self.eval_fraction < 1.0:
            raise _fail("data.eval_fraction", self.eval_fraction,
                        "it must be in (0, 1): a JSONL dataset always holds out some rows for evaluation")
        digest = self.chat_template_digest
        if digest is not None and not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise _fail("data.chat_template_digest", digest, "it must be a sha256 in hex (filled in by rlx run)")
        if digest is not None and not self.chat_template:
            raise _fail("data.chat_template_digest", digest, "it is set only with data.chat_template=true")
        if self.chat_template_file is not None:
            self._choice("chat_template_file", CHAT_TEMPLATE_FILES)
            if not self.chat_template:
                raise _fail("data.chat_template_file", self.chat_template_file,
                            "it is set only with data.chat_template=true")
        if self.task_version is not None and not self.task_version.strip():
            raise _fail("data.task_version", self.task_version, "it must be a version (filled in by rlx run)")


@dataclasses.dataclass(frozen=True)
class SamplingConfig(Section):
    """How rollouts are sampled: ``group_size`` samples per prompt, at most ``max_tokens``
    completion tokens each (None: the task's own budget, ``Task.max_tokens``: 5 for the built-in
    arithmetic, whose longest answer is four digits and the end token; 8 otherwise). A config
    always holds the number itself: ``Config`` fills it in from ``data.task``."""

    NAME = "sampling"
    group_size: int = 8
    """Completions sampled per prompt (a group; advantages compare within it)."""
    temperature: float = 1.0
    """Sampling temperature (0: greedy)."""
    top_p: float = 1.0
    """Nucleus sampling: the smallest set of tokens whose probability reaches top_p (1: all)."""
    top_k: int = 0
    """Sample among the k most likely tokens (0: all)."""
    max_tokens: int | None = None
    """Most tokens of a completion; unset: the task's own budget (filled in when the config is read)."""

    def check(self) -> None:
        self._at_least("group_size", 1)
        self._at_least("temperature", 0.0)
        if not 0.0 < self.top_p <= 1.0:
            raise _fail("sampling.top_p", self.top_p, "it must be in (0, 1]")
        self._at_least("top_k", 0)
        self._at_least("max_tokens", 1)
        if self.max_tokens is not None and self.max_tokens > MAX_TOKENS:
            raise _fail("sampling.max_tokens", self.max_tokens, f"it must be <= {MAX_TOKENS}")

    def request(self) -> dict[str, Any]:
        """The sampling parameters every rollout request carries."""
        assert self.max_tokens is not None, "Config fills in sampling.max_tokens"
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "max_tokens": self.max_tokens}


@dataclasses.dataclass(frozen=True)
class AlgorithmConfig(Section):
    """The objective: a registry name and overrides of its options (``kernels.objectives``)."""

    NAME = "algorithm"
    name: str = "grpo"
    """The objective, a name of the registry (kernels.objectives), e.g. grpo, rloo, dapo, reinforce."""
    options: dict = dataclasses.field(default_factory=dict)
    """Overrides of the objective's options, e.g. {clip_high = 0.28, kl_coef = 0.01}."""

    def check(self) -> None:
        from kernels.objectives import ALGORITHMS

        if self.name not in ALGORITHMS:
            raise _fail("algorithm.name", self.name, "accepted: " + ", ".join(ALGORITHMS))


@dataclasses.dataclass(frozen=True)
class SchedulingConfig(Section):
    """Staleness and batching (``runtime.controller.decide`` states the rules).

    ``groups_per_batch`` groups of ``sampling.group_size`` rollouts form a batch. With
    ``filter_groups`` (DAPO dynamic sampling; None follows the algorithm's ``dynamic_sampling``)
    groups whose rewards are all equal are dropped and replaced, drawing at most
    ``max_groups_per_batch`` groups per batch (default 4 × ``groups_per_batch``); past that,
    the batch is completed with the dropped groups so that every batch has the same shape.
    ``draw_ahead`` (deterministic mode, with ``filter_groups``): how many groups beyond those a
    batch still needs are kept in flight, so that a group found uniform has a replacement being
    sampled already rather than one drawn after it: fewer rounds of sampling a batch, the same
    prompts in the same order, good groups beyond ``groups_per_batch`` dropped as surplus.
    """

    NAME = "scheduling"
    mode: str = "deterministic"
    """deterministic (bit-exact, replayable schedule) or freshest (train on whatever is ready first)."""
    max_staleness: int = 1
    """How many versions older than the one trained a rollout's policy may be."""
    groups_per_batch: int = 32
    """Groups (of sampling.group_size completions) per train step."""
    filter_groups: bool | None = None
    """Drop groups whose rewards are all equal (DAPO dynamic sampling); unset: the algorithm's dynamic_sampling."""
    max_groups_per_batch: int | None = None
    """Most groups drawn for one batch when filtering; unset: 4 x groups_per_batch."""
    draw_ahead: int | None = None
    """Groups kept in flight beyond those a batch still needs when filtering; unset: none."""

    def check(self) -> None:
        self._choice("mode", MODES)
        self._at_least("max_staleness", 0)
        self._at_least("groups_per_batch", 1)
        if self.draw_ahead is not None:
            self._at_least("draw_ahead", 0)
        if self.draw_ahead and (self.mode != DETERMINISTIC or self.filter_groups is False):
            raise _fail("scheduling.draw_ahead", self.draw_ahead,
                        "it needs scheduling.filter_groups and mode = \"deterministic\" (or 0)")
        if self.max_groups_per_batch is not None and self.max_groups_per_batch < self.groups_per_batch:
            raise _fail(
                "scheduling.max_groups_per_batch", self.max_groups_per_batch,
                f"it must be >= scheduling.groups_per_batch ({self.groups_per_batch})",
            )


@dataclasses.dataclass(frozen=True)
class MeshShape:
    """The shape of ``trainer.mesh`` (``runtime.trainer.mesh``): the size of each axis; 1 everywhere
    is no mesh at all (the step on one device)."""

    data: int = 1
    fsdp: int = 1
    model: int = 1

    @classmethod
    def of(cls, table: Mapping[str, Any] | None) -> MeshShape:
        """The shape of a ``trainer.mesh`` table; ValueError names a bad axis or size."""
        table = dict(table or {})
        unknown = sorted(set(table) - set(MESH_AXES))
        if unknown:
            raise ValueError(f"unknown axis {unknown[0]!r}; accepted: {', '.join(MESH_AXES)}")
        for axis, size in table.items():
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"axis {axis}={size!r}: a size must be an integer >= 1")
        return cls(**table)

    @property
    def size(self) -> int:
        """How many devices the mesh takes."""
        return self.data * self.fsdp * self.model

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.data, self.fsdp, self.model)

    def describe(self) -> str:
        return "×".join(f"{axis}={n}" for axis, n in zip(MESH_AXES, self.shape, strict=True) if n > 1) or "one device"


@dataclasses.dataclass(frozen=True)
class TrainerConfig(Section):
    """The optimizer of the train step (AdamW with warm-up and global-norm clipping,
    ``runtime.trainer.optimizer``) and how the step bounds its memory (``runtime.trainer.step``,
    whose config is derived from this section, defaults included): ``micro_batch_size`` rows per
    gradient micro-batch (0: the whole batch at once; else a divisor of the batch size), log-probs
    ``logits_chunk`` positions at a time (0: all at once, a ``[rows, width, vocab]`` float32
    array), and ``remat``: recompute each decoder layer in the backward pass. These change the
    last bits, never the loss or the gradient. ``shared_prefix``: the whole-batch step computes
    the prompt that a group's rows share once per group (``runtime.trainer.batch.shared_prefix``),
    less than half the work on short completions, the same values up to float32 rounding; unset,
    a new run resolves it to true unless a memory bound is set, and a run logged before it
    existed reads as false (every row in full). ``old_logprobs``: where the old log-probs
    ``log π_old`` of rollouts sampled from an earlier version than the one trained come from:
    ``"recompute"``, a forward pass of that version in the trainer, or ``"behaviour"``, the
    log-probs the engine sampled them with (no extra pass; the ratio is then to the policy that
    actually sampled, engine numerics included). Unset, a new run resolves it to ``"behaviour"``
    for a float32 model, whose engine and trainer agree to float32 rounding, and to
    ``"recompute"`` otherwise; a run logged before it existed reads as ``"recompute"``.
    ``completion_logits``: the whole-batch step computes the LM head and the log-probs only at the
    ``sampling.max_tokens`` positions where each row's completion can be
    (``runtime.trainer.step``'s ``completion_window``), not at prompt positions whose log-probs no
    objective reads; the same values up to float32 rounding. Unset, a new run resolves it like
    ``shared_prefix``, and a run logged before it existed reads as false. ``prefix_per_octave``:
    the shared prefix is the batch's shortest prompt rounded down to one of this many lengths per
    octave (a power of two from 1 to 64; more: less of the prompt computed per row, more lengths to
    compile the step for); unset, a new run resolves it to 8, and a run logged before it existed
    reads as 1 (a power of two).
    ``mesh``: ``{data=…, fsdp=…, model=…}`` lays the step out on a device mesh of that shape (axes
    left out are 1; ``runtime.trainer.mesh``); empty, the step runs on one device.
    ``deterministic_reduction``: on a mesh, sum the gradient over the row shards in a fixed order
    (all-gather, then a sum in shard order) instead of the collective's own order, so that the
    bits do not depend on how the devices are spread over processes (1 × 4, 2 × 2 and 4 × 1 alike);
    it costs a second forward pass and the whole gradient on every device. ``pack``: put several
    sequences into each row of the step (first fit by decreasing length, each attending only within
    itself, ``runtime.trainer.batch.pack_bins``) instead of one padded row each: the same per-token
    values up to float rounding, less padding computed when lengths differ; it replaces the shared
    prefix and the completion window (which need a group's rows side by side). A run logged before
    it existed reads as false. ``exact_logprobs``: the trainer's log-prob of every sampled token
    equals the engine's bit for bit (``runtime.numerics``): the engine's decode and prefill
    attention and the trainer's run in one fixed order over pages of ``workers.page_size`` tokens,
    every matmul has at least 64 rows, and the processes compile without fused multiply-adds; the
    controller then requires a zero log-prob mismatch on every step, and ``old_logprobs`` resolves
    to ``"behaviour"`` whatever the dtype. The shared prefix, the completion window and packing keep
    the bits; micro-batches, chunks and remat keep the log-probs' (their gradient pass is the
    bounded step's own); on the CPU backend of x86-64 only, and not with a ``model`` mesh axis.
    Unset, a new run resolves it to false, and a run logged before it existed reads as false."""

    NAME = "trainer"
    learning_rate: float = 2e-4
    """Peak AdamW learning rate of the RL step."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Clip the gradient to this global norm before the AdamW update."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up steps."""
    micro_batch_size: int = 0
    """Rows per gradient micro-batch (0: the whole batch at once; else a divisor of the batch)."""
    logits_chunk: int = 0
    """Compute log-probs this many positions at a time (0: all at once)."""
    remat: bool = False
    """Recompute each decoder layer in the backward pass (less memory, more compute)."""
    shared_prefix: bool | None = None
    """Compute a group's shared prompt once per group; unset: true unless a memory bound or pack is set."""
    old_logprobs: str | None = None
    """Where old log-probs come from: recompute (a trainer forward pass) or behaviour (the engine's); unset:
    behaviour for float32, else recompute."""
    completion_logits: bool | None = None
    """Compute the LM head only at completion positions; unset: like shared_prefix."""
    prefix_per_octave: int | None = None
    """Shared-prefix lengths per octave (a power of two from 1 to 64); unset: 8."""
    mesh: dict = dataclasses.field(default_factory=dict)
    """Lay the step out on a device mesh, e.g. {fsdp = 2} or {data = 2, model = 2}; empty: one device."""
    deterministic_reduction: bool = False
    """On a mesh, sum gradients over row shards in a fixed order (same bits however devices are spread over
    processes)."""
    pack: bool = False
    """Pack several sequences into each row of the step instead of one padded row each."""
    exact_logprobs: bool | None = None
    """The trainer's log-probs equal the engine's bit for bit (CPU, x86-64); unset: false."""

    @property
    def bounded(self) -> bool:
        """Whether a memory bound (micro-batches, logits chunks, remat) is set."""
        return self.micro_batch_size > 0 or self.logits_chunk > 0 or self.remat

    def check(self) -> None:
        for name in ("shared_prefix", "completion_logits"):  # the whole-batch step's own work savers
            if getattr(self, name) and self.bounded:
                raise _fail(f"trainer.{name}", getattr(self, name),
                            "it works on the whole-batch step only: false, or unset with micro_batch_size, "
                            "logits_chunk or remat")
            if getattr(self, name) and self.pack:
                raise _fail(f"trainer.{name}", getattr(self, name),
                            "it works on padded rows (a group's rows side by side): false, or unset with trainer.pack")
        if self.pack and self.deterministic_reduction:
            raise _fail("trainer.pack", self.pack, "the fixed-order reduction sums padded rows: set "
                                                   "trainer.deterministic_reduction=false, or trainer.pack=false")
        if self.old_logprobs is not None:
            self._choice("old_logprobs", OLD_LOGPROBS)
        octave = self.prefix_per_octave
        if octave is not None and not (1 <= octave <= 64 and octave & (octave - 1) == 0):
            raise _fail("trainer.prefix_per_octave", octave, "it must be a power of two from 1 to 64")
        try:
            shape = MeshShape.of(self.mesh)
        except (TypeError, ValueError) as e:
            raise _fail("trainer.mesh", self.mesh, str(e)) from None
        rows = shape.data * shape.fsdp
        if rows > 1 and self.micro_batch_size % rows:
            raise _fail("trainer.micro_batch_size", self.micro_batch_size,
                        f"on trainer.mesh {shape.describe()} a micro-batch splits over its {rows} row shards: "
                        f"give a multiple of {rows}")
        if self.exact_logprobs and shape.model > 1:
            raise _fail("trainer.exact_logprobs", self.exact_logprobs,
                        f"a model axis splits the contractions over devices (trainer.mesh {shape.describe()}): "
                        "use a mesh of model=1, or trainer.exact_logprobs=false")
        if self.deterministic_reduction and shape.model > 1:
            raise _fail("trainer.deterministic_reduction", self.deterministic_reduction,
                        "it fixes the order of the sums over the batch's rows (data, fsdp), not over the model "
                        "axis: use it with a mesh of model=1")
        if self.learning_rate <= 0.0:
            raise _fail("trainer.learning_rate", self.learning_rate, "it must be > 0")
        self._at_least("weight_decay", 0.0)
        self._at_least("max_grad_norm", 0.0)
        self._at_least("warmup_steps", 0)
        self._at_least("micro_batch_size", 0)
        self._at_least("logits_chunk", 0)


ADMISSIONS = ("prompt_length", "arrival")  # runtime.inference.engine.ADMISSIONS


@dataclasses.dataclass(frozen=True)
class InferenceConfig(Section):
    """The inference engine's layout: ``mesh = {model=N}`` splits its weights (attention heads,
    MLP units, the LM head's vocabulary) and its KV cache's kv heads over N devices of each
    inference worker (``runtime.inference.Engine``); empty, one device. A request's tokens still
    do not depend on its batch, but they do on the mesh (each worker records it).
    ``kv_pages``: the pages of each engine's KV cache pool (0: the worst case, every decode slot's
    longest sequence). A smaller pool holds the tokens actually live; when it runs out the
    youngest sequence is preempted and recomputed later, with the same tokens whatever the
    preemption pattern (``runtime.inference.scheduler``). It must hold one longest sequence.
    ``admission``: the order an engine's queued requests take free slots: ``"prompt_length"``
    (unset; shortest prompt first, a prompt's samples together: sequences decoded together have
    similar lengths, and a decode step's attention runs to the longest of them) or
    ``"arrival"``; no completion depends on it."""

    NAME = "inference"
    mesh: dict = dataclasses.field(default_factory=dict)
    """Split the engine over devices of each inference worker: {model = N}; empty: one device."""
    kv_pages: int = 0
    """Pages of each engine's KV pool (0: the worst case, every slot's longest sequence)."""
    admission: str | None = None
    """Order queued requests take free slots: prompt_length (shortest first; unset) or arrival."""

    def check(self) -> None:
        self._at_least("kv_pages", 0)
        if self.admission is not None and self.admission not in ADMISSIONS:
            raise _fail("inference.admission", self.admission, f"accepted: {', '.join(ADMISSIONS)}")
        try:
            shape = MeshShape.of(self.mesh)
        except (TypeError, ValueError) as e:
            raise _fail("inference.mesh", self.mesh, str(e)) from None
        if shape.data > 1 or shape.fsdp > 1:
            raise _fail("inference.mesh", self.mesh, "the engine splits over model only (data and fsdp are the "
                                                    "trainer's axes): write inference.mesh={model=N}")


ATTENTIONS = ("auto", "live", "reference", "pallas", "ordered")
MAX_TRAINER_PROCESSES = 64  # one host's worth of ranks for the local launcher
PROCESSES = "processes"
THREADS = "threads"


@dataclasses.dataclass(frozen=True)
class WorkersConfig(Section):
    """Worker pools and leases: whether the roles run as supervised ``rlx worker`` processes
    served over gRPC (``mode = "processes"``, the default: kill any one and the run goes on) or
    as threads of the ``rlx run`` process (``"threads"``); how many of each, how many concurrent leases per inference
    worker (``inference_slots``), how many sequences its engine decodes together
    (``inference_batch``; leases beyond it wait in the engine's queue and enter as slots free
    up), the tokens per page of its KV cache (``page_size``), and after how many seconds
    without a heartbeat a lease is given up. ``trainer_processes``: P > 1 runs the trainer as a
    gang of P processes joined with ``jax.distributed`` (``runtime.trainer.gang``; processes
    mode, with a ``trainer.mesh`` over every device of the gang). ``attention``: the engine's
    decode attention (``kernels.paged_attention``): ``"live"`` reads only the pages of the
    longest live sequence, ``"reference"`` every page a sequence could hold, ``"pallas"`` the
    TPU kernel, ``"auto"`` the Pallas kernel where the inference worker's backend is a TPU and
    ``"live"`` elsewhere (each worker records the one it runs); unset, a new run resolves it to
    ``"auto"``, and a run logged before it existed reads as ``"reference"``. ``no_progress_s``:
    after this many seconds without an accepted completion, outcome, step or version the host
    says in one line what the run is waiting for (0: never). ``devices``: which of the host's
    devices each process of processes mode sees (``runtime.placement``): ``"auto"`` (what a new
    run records when it is unset), ``"inherit"`` (each sees what ``rlx run`` sees; a run logged
    before it existed reads as this), or a table of role = device ids."""

    NAME = "workers"
    mode: str = PROCESSES
    """processes (supervised rlx worker processes over gRPC) or threads (threads of rlx run)."""
    inference: int = 1
    """Inference workers."""
    inference_slots: int = 256
    """Concurrent leases per inference worker."""
    inference_batch: int = 64
    """Sequences an inference worker's engine decodes together."""
    page_size: int = 16
    """Tokens per page of the engine's KV cache."""
    verifiers: int = 1
    """Verifier workers (they score completions)."""
    lease_timeout_s: float = 120.0
    """Seconds without a heartbeat after which a worker's lease is given up."""
    trainer_processes: int = 1
    """Trainer processes (more than 1: a gang joined with jax.distributed, processes mode)."""
    attention: str | None = None
    """The engine's decode attention: auto, live, reference, pallas or ordered; unset: auto (ordered with
    trainer.exact_logprobs)."""
    no_progress_s: float = 600.0
    """Seconds without progress after which the host says what the run waits for (0: never)."""
    devices: str | dict | None = None
    """Which devices each process sees: auto, inherit, or a table of role = device ids; unset: auto."""

    def check(self) -> None:
        self._choice("mode", [PROCESSES, THREADS])
        self._at_least("inference", 1)
        self._at_least("inference_slots", 1)
        self._at_least("inference_batch", 1)
        self._at_least("page_size", 1)
        self._at_least("verifiers", 1)
        self._at_least("trainer_processes", 1)
        if self.attention is not None:
            self._choice("attention", ATTENTIONS)
        if self.trainer_processes > MAX_TRAINER_PROCESSES:
            raise _fail("workers.trainer_processes", self.trainer_processes,
                        f"it must be <= {MAX_TRAINER_PROCESSES}")
        if self.trainer_processes > 1 and self.mode != PROCESSES:
            raise _fail("workers.trainer_processes", self.trainer_processes,
                        'a trainer gang runs as processes: it needs workers.mode="processes"')
        if self.lease_timeout_s <= 0.0:
            raise _fail("workers.lease_timeout_s", self.lease_timeout_s, "it must be > 0")
        if not 0.0 <= self.no_progress_s < float("inf"):
            raise _fail("workers.no_progress_s", self.no_progress_s, "it must be a number of seconds >= 0 (0: never)")
        if isinstance(self.devices, str) and self.devices not in DEVICE_LAYOUTS:
            raise _fail("workers.devices", self.devices, f'accepted: {", ".join(map(repr, DEVICE_LAYOUTS))}, or a '
                                                         "table of role = device ids (e.g. {trainer = [0, 1], "
                                                         "inference = [[2], [3]], evaluator = [2]})")
        if isinstance(self.devices, dict):
            unknown = sorted(set(self.devices) - {"trainer", "inference", "evaluator"})
            if unknown:
                raise _fail("workers.devices", self.devices, f"unknown role {unknown[0]!r}; accepted: trainer, "
                                                             "inference, evaluator")


@dataclasses.dataclass(frozen=True)
class VerifierConfig(Section):
    """The code sandbox of tasks with code tests: its isolation level and how many programs run
    at once (``slots``). ``auto`` takes the strongest level this machine allows and refuses to
    fall back to the weak ``rlimits`` level, under which a program can read the host's files and
    reach its servers; naming ``rlimits`` accepts that.

    ``reward``: the user's own reward function scores every completion instead of the task's
    verifier (``verifiers.reward``): ``FILE.py`` (its function ``reward``) or ``FILE.py:FUNCTION``,
    called as ``FUNCTION(prompt, completion, answer)`` and returning a finite number, in the code
    sandbox (one file, standard library only). ``reward_digest`` is filled in with the file's
    sha256 when the run starts; wherever the file is loaded again (a verifier worker, a resume)
    one that differs is refused."""

    NAME = "verifier"
    isolation: str = "auto"
    """The code sandbox's isolation: auto (the strongest available; refuses the weak level), namespaces or rlimits."""
    slots: int = 4
    """Sandboxed programs that may run at once (at least 2)."""
    reward: str | None = None
    """Your own reward function instead of the task's verifier: FILE.py (its function reward) or FILE.py:FUNCTION,
    called as FUNCTION(prompt, completion, answer) in the code sandbox and returning a number."""
    reward_digest: str | None = None
    """sha256 of the reward file; filled in when the run starts, checked wherever the file is loaded again."""

    def check(self) -> None:
        from verifiers.code import Isolation

        self._choice("isolation", [level.value for level in Isolation])
        self._at_least("slots", 2)  # a check script runs beside the program it checks
        if self.reward is not None and not self.reward.strip():
            raise _fail("verifier.reward", self.reward, "give a Python file, FILE.py or FILE.py:FUNCTION")
        digest = self.reward_digest
        if digest is not None and not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise _fail("verifier.reward_digest", digest, "it must be a sha256 in hex (filled in by rlx run)")
        if digest is not None and self.reward is None:
            raise _fail("verifier.reward_digest", digest, "it is set only with verifier.reward")


@dataclasses.dataclass(frozen=True)
class EpisodesConfig(Section):
    """Multi-turn episodes with tools (``runtime.episodes``): with ``tools`` named, every rollout
    is an episode of turns in which the model may call them (read from its tokens by ``rule``), the
    tool's result is appended as ids, and the model goes on from the episode's ids, token in,
    token out. ``sampling.max_tokens`` then bounds the whole episode after the prompt (the model's
    turns and the appended results); ``turn_tokens`` bounds one turn; ``max_calls`` the calls of
    an episode (a call past it is scored as the final answer). The task's verifier scores the
    last turn. ``rule_digest`` is filled in with the rule's digest when the run starts, and a
    replay or resume whose rule reads calls otherwise is refused."""

    NAME = "episodes"
    tools: tuple = ()
    """Tools the model may call in a multi-turn episode: calculator, python (empty: one completion per rollout)."""
    rule: str = "tag"
    """How a tool call is read from the model's text: tag (<tool>NAME: ARGUMENTS</tool>) or fence (```python)."""
    max_calls: int = 4
    """Tool calls an episode may make; a call past it is scored as the final answer."""
    turn_tokens: int = 32
    """Most tokens the model samples in one turn."""
    rule_digest: str | None = None
    """sha256 of the tool-call rule; filled in when the run starts, checked on resume and replay."""

    def check(self) -> None:
        from runtime.episodes.parsing import RULES

        for tool in self.tools:
            if tool not in EPISODE_TOOLS:
                raise _fail("episodes.tools", self.tools, f"unknown tool {tool!r}; accepted: {', '.join(EPISODE_TOOLS)}")
        if len(set(self.tools)) != len(self.tools):
            raise _fail("episodes.tools", self.tools, "name each tool once")
        self._choice("rule", RULES)
        self._at_least("max_calls", 1)
        self._at_least("turn_tokens", 1)
        if self.turn_tokens > MAX_TOKENS:
            raise _fail("episodes.turn_tokens", self.turn_tokens, f"it must be <= {MAX_TOKENS}")
        digest = self.rule_digest
        if digest is not None and not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise _fail("episodes.rule_digest", digest, "it must be a sha256 in hex (filled in by rlx run)")
        if digest is not None and not self.tools:
            raise _fail("episodes.rule_digest", digest, "it is set only with episodes.tools")


EPISODE_TOOLS = ("calculator", "python")


@dataclasses.dataclass(frozen=True)
class LedgerConfig(Section):
    """Where events go: a store URL or SQLite path (None: ``DIR/ledger.db``), how durably a
    SQLite ledger commits (``PRAGMA synchronous``; PostgreSQL always commits synchronously), and
    every how many events the controller snapshots its folded state so a resume folds only the
    tail (``snapshot_every``; 0: never)."""

    NAME = "ledger"
    url: str | None = None
    """The event store: a SQLite path or a postgresql:// URL (no password in it); unset: DIR/ledger.db."""
    synchronous: str = "FULL"
    """SQLite's PRAGMA synchronous: OFF, NORMAL, FULL or EXTRA."""
    snapshot_every: int = 50_000
    """Events between snapshots of the controller's folded state (0: never)."""

    def check(self) -> None:
        from ledger.store import SQLITE_SYNCHRONOUS

        self._choice("synchronous", SQLITE_SYNCHRONOUS)
        self._at_least("snapshot_every", 0)
        _without_credentials("ledger.url", self.url)


@dataclasses.dataclass(frozen=True)
class ParamsConfig(Section):
    """The parameter store URL (None: ``DIR/params``), how many newest versions to keep, and
    ``keep_every``: keep every N-th version (with its optimizer state) as a checkpoint that
    ``rlx replay --from-version`` can start from (0: none; see ``ControllerSpec.kept``)."""

    NAME = "params"
    url: str | None = None
    """The parameter store: a directory or URL; unset: DIR/params."""
    keep_newest: int = 2
    """Newest weight versions kept (at least max_staleness + 1 after resolving)."""
    keep_every: int = 0
    """Keep every N-th version with its optimizer state, for rlx replay --from-version (0: none)."""

    def check(self) -> None:
        self._at_least("keep_newest", 1)
        self._at_least("keep_every", 0)
        _without_credentials("params.url", self.url)


MAX_EVAL_SAMPLES = 1024  # completions per problem for pass@k: past this an evaluation outweighs the run


@dataclasses.dataclass(frozen=True)
class EvalConfig(Section):
    """Held-out evaluation during the run: every ``every_steps`` versions (from version 0, plus
    the final one; 0: none), ``size`` held-out problems (at most the task's held-out split) get
    one greedy completion and ``samples`` sampled ones each (None: ``k``), from which pass@``k``
    is estimated without bias (None: ``sampling.group_size``). Each result is a
    ``VersionEvaluated`` event of the version it evaluated; see ``runtime.evaluation``."""

    NAME = "eval"
    every_steps: int = 100
    """Evaluate every this many versions, from version 0 and the final one (0: none)."""
    size: int = 100
    """Held-out problems per evaluation."""
    k: int | None = None
    """pass@k's k; unset: sampling.group_size."""
    samples: int | None = None
    """Sampled completions per held-out problem (at least k); unset: k."""

    def check(self) -> None:
        self._at_least("every_steps", 0)
        self._at_least("size", 1)
        self._at_least("k", 1)
        self._at_least("samples", 1)
        for name in ("k", "samples"):
            value = getattr(self, name)
            if value is not None and value > MAX_EVAL_SAMPLES:
                raise _fail(f"eval.{name}", value, f"it must be <= {MAX_EVAL_SAMPLES}")
        if self.k is not None and self.samples is not None and self.samples < self.k:
            raise _fail("eval.samples", self.samples, f"it must be >= eval.k ({self.k}): pass@k needs k samples")


@dataclasses.dataclass(frozen=True)
class LogConfig(Section):
    """Where metrics are also written for people to watch (the ledger stays the record):
    ``tensorboard``, a directory for TensorBoard event files (None: none)."""

    NAME = "log"
    tensorboard: str | None = None
    """A directory for TensorBoard event files; unset: none."""

    def check(self) -> None:
        if self.tensorboard is not None and not self.tensorboard.strip():
            raise _fail("log.tensorboard", self.tensorboard, "give a directory path, or leave it unset")


RETIRED: dict[str, dict[str, str]] = {
    "pretrain": {"eval_size": "the held-out evaluation before and after RL is eval.size's"},
}
"""Fields that configs logged by older runs hold and that no longer exist: read back, they are
dropped; a new config that sets one is refused with the reason."""

SECTIONS: dict[str, type[Section]] = {
    cls.NAME: cls
    for cls in (RunConfig, ModelConfig, PretrainConfig, DataConfig, SamplingConfig, AlgorithmConfig,
                SchedulingConfig, TrainerConfig, InferenceConfig, WorkersConfig, VerifierConfig, EpisodesConfig,
                LedgerConfig, ParamsConfig, EvalConfig, LogConfig)
}


def task_max_tokens(task: str) -> int:
    """The completion budget of the task named ``task`` (``Task.max_tokens``); an unknown name
    gets the base budget here and its one-line refusal when the task is built."""
    from runtime.tasks import task_class
    from runtime.tasks.base import Task

    return getattr(task_class(task), "max_tokens", Task.max_tokens)


@dataclasses.dataclass(frozen=True)
class Config:
    """The whole run configuration."""

    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    pretrain: PretrainConfig = dataclasses.field(default_factory=PretrainConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    sampling: SamplingConfig = dataclasses.field(default_factory=SamplingConfig)
    algorithm: AlgorithmConfig = dataclasses.field(default_factory=AlgorithmConfig)
    scheduling: SchedulingConfig = dataclasses.field(default_factory=SchedulingConfig)
    trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)
    inference: InferenceConfig = dataclasses.field(default_factory=InferenceConfig)
    workers: WorkersConfig = dataclasses.field(default_factory=WorkersConfig)
    verifier: VerifierConfig = dataclasses.field(default_factory=VerifierConfig)
    episodes: EpisodesConfig = dataclasses.field(default_factory=EpisodesConfig)
    ledger: LedgerConfig = dataclasses.field(default_factory=LedgerConfig)
    params: ParamsConfig = dataclasses.field(default_factory=ParamsConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    log: LogConfig = dataclasses.field(default_factory=LogConfig)

    def __post_init__(self) -> None:
        if self.sampling.max_tokens is None:  # the task's own budget (frozen: set as __init__ does)
            object.__setattr__(self, "sampling", dataclasses.replace(
                self.sampling, max_tokens=task_max_tokens(self.data.task)))
        self.objective()  # the registry rejects unknown options and invalid combinations
        rows = self.scheduling.groups_per_batch * self.sampling.group_size
        micro = self.trainer.micro_batch_size
        if micro and rows % micro:
            raise _fail("trainer.micro_batch_size", micro,
                        f"it must be 0 (the whole batch) or divide the batch of {rows} rows "
                        "(scheduling.groups_per_batch × sampling.group_size)")
        if self.trainer.exact_logprobs:
            if MeshShape.of(self.inference.mesh).model > 1:
                raise _fail("trainer.exact_logprobs", True, "the engine's model axis splits its contractions over "
                                                            "devices: set inference.mesh={} or trainer.exact_logprobs=false")
            if self.workers.attention not in (None, "auto", "ordered"):
                raise _fail("workers.attention", self.workers.attention,
                            "trainer.exact_logprobs runs the engine's attention in the trainer's order: leave "
                            "workers.attention unset (or \"ordered\")")
        gang, mesh = self.workers.trainer_processes, MeshShape.of(self.trainer.mesh).size
        if gang > 1 and mesh % gang:
            raise _fail("trainer.mesh", self.trainer.mesh,
                        f"a gang of workers.trainer_processes={gang} needs a mesh over all of its devices "
                        f"(a multiple of {gang}), e.g. trainer.mesh={{fsdp={gang}}}")

    @property
    def max_tokens(self) -> int:
        """``sampling.max_tokens``: always a number in a ``Config`` (``__post_init__``)."""
        assert self.sampling.max_tokens is not None
        return self.sampling.max_tokens

    def objective(self) -> Any:
        """The configured objective (``kernels.objectives.configure``) of this run.

        ``group_size`` and ``max_length`` come from the sampling section unless the options
        set them.
        """
        from kernels.objectives import ALGORITHMS, ObjectiveConfigError, configure

        options = dict(self.algorithm.options)
        for name in sorted(NO_VALUE_MODEL & set(options)):
            raise _fail(f"algorithm.options.{name}", options[name],
                        "rlx run trains no value model (GAE runs over a zero baseline), so value-loss options "
                        "have no effect; leave them out")
        known = {f.name for f in dataclasses.fields(ALGORITHMS[self.algorithm.name])}
        for name, value in (("group_size", self.sampling.group_size), ("max_length", self.sampling.max_tokens)):
            if name in known:
                options.setdefault(name, value)
        try:
            return configure(self.algorithm.name, **options)
        except ObjectiveConfigError as e:
            raise ConfigError(f"algorithm: {e}") from None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Config:
        """Build and validate a config from nested tables (missing fields take defaults)."""
        if not isinstance(data, Mapping):
            raise _fail("config", data, "it must be a table of sections")
        sections: dict[str, Any] = {}  # section name -> the section of that name
        for name, table in data.items():
            if name not in SECTIONS:
                raise _fail("config section", name, "accepted: " + ", ".join(SECTIONS))
            section = SECTIONS[name]
            if not isinstance(table, Mapping):
                raise _fail(f"config section {name}", table, "it must be a table of fields")
            accepted = [f.name for f in dataclasses.fields(section)]
            table = {k: v for k, v in table.items() if k not in RETIRED.get(name, {})}
            for key in table:
                if key not in accepted:
                    raise _fail(f"{name} field", key, "accepted: " + ", ".join(accepted))
            sections[name] = section(**table)
        return cls(**sections)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Every field of every section, as plain values (the form stored in ``RunStarted``)."""
        return {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}

    def resolved(self, *, data_size: int | None = None, chat_template_digest: str | None = None,
                 chat_template_file: str | None = None, task_version: str | None = None,
                 reward_digest: str | None = None) -> Config:
        """The config with every choice explicit: ``filter_groups`` from the algorithm,
        ``max_groups_per_batch`` from ``groups_per_batch``, ``data.size``,
        ``data.chat_template_digest``, ``data.task_version`` and ``verifier.reward_digest`` when given,
        ``params.keep_newest`` at least
        ``max_staleness + 1``, ``eval.k`` and ``eval.samples``, ``trainer.shared_prefix``,
        ``trainer.completion_logits``, ``trainer.prefix_per_octave``, ``trainer.old_logprobs``, ``workers.attention``
        and ``workers.devices``."""
        s = self.scheduling
        filter_groups = s.filter_groups
        if filter_groups is None:
            filter_groups = bool(getattr(self.objective(), "dynamic_sampling", False))
        cap = s.max_groups_per_batch if s.max_groups_per_batch is not None else 4 * s.groups_per_batch
        if s.draw_ahead and not filter_groups:  # left to the algorithm (check() refuses an explicit false)
            raise _fail("scheduling.draw_ahead", s.draw_ahead,
                        f"it needs scheduling.filter_groups, which algorithm {self.algorithm.name!r} leaves off (or 0)")
        data = self.data if data_size is None else dataclasses.replace(self.data, size=data_size)
        if chat_template_digest is not None:
            data = dataclasses.replace(data, chat_template_digest=chat_template_digest)
        if chat_template_file is not None:
            data = dataclasses.replace(data, chat_template_file=chat_template_file)
        if task_version is not None:
            data = dataclasses.replace(data, task_version=task_version)
        # The trainer recomputes old log-probs with the weights each rollout was sampled from, up
        # to max_staleness versions back: those must still be in the parameter store (I5).
        params = dataclasses.replace(self.params, keep_newest=max(self.params.keep_newest, s.max_staleness + 1))
        k = self.eval.k if self.eval.k is not None else self.sampling.group_size
        samples = self.eval.samples if self.eval.samples is not None else k
        if samples < k:
            raise _fail("eval.samples", samples, f"it must be >= eval.k ({k}; by default sampling.group_size): "
                                                 "pass@k needs k samples")
        trainer = self.trainer
        if trainer.exact_logprobs is None:
            trainer = dataclasses.replace(trainer, exact_logprobs=False)
        if trainer.shared_prefix is None:
            trainer = dataclasses.replace(trainer, shared_prefix=not trainer.bounded and not trainer.pack)
        if trainer.prefix_per_octave is None:
            trainer = dataclasses.replace(trainer, prefix_per_octave=8)
        if trainer.completion_logits is None:
            trainer = dataclasses.replace(trainer, completion_logits=not trainer.bounded and not trainer.pack)
        if trainer.old_logprobs is None:
            trainer = dataclasses.replace(
                trainer, old_logprobs="behaviour" if self.model.dtype == "float32" or trainer.exact_logprobs
                else "recompute"
            )
        verifier = self.verifier
        if reward_digest is not None:
            verifier = dataclasses.replace(verifier, reward_digest=reward_digest)
        workers = self.workers
        if trainer.exact_logprobs:  # the engine's attention in the trainer's order
            workers = dataclasses.replace(workers, attention="ordered")
        elif workers.attention is None:  # the backend is the inference worker's: settled where it runs
            workers = dataclasses.replace(workers, attention="auto")
        if workers.devices is None:  # the host's devices: laid out where it runs (runtime.placement)
            workers = dataclasses.replace(workers, devices="auto")
        return dataclasses.replace(
            self,
            trainer=trainer,
            workers=workers,
            verifier=verifier,
            scheduling=dataclasses.replace(s, filter_groups=filter_groups, max_groups_per_batch=cap),
            data=data,
            params=params,
            eval=dataclasses.replace(self.eval, k=k, samples=samples),
        )

    def digest(self) -> str:
        """:func:`config_digest` of this config."""
        return config_digest(self.to_dict())


def config_digest(config: Mapping[str, Any]) -> str:
    """sha256 (hex) of the canonical msgpack encoding of a config dict: key order never matters."""
    from ledger.codec import pack

    return hashlib.sha256(pack(dict(config))).hexdigest()


def parse_override(text: str) -> tuple[tuple[str, ...], Any]:
    """``"section.field=value"`` as (path, value); the value is read as TOML, else a string.

    ``scheduling.max_staleness=2`` gives 2, ``model.path=/x/y`` the string ``/x/y``,
    ``algorithm.options={clip_high=0.28}`` a table.
    """
    key, sep, raw = text.partition("=")
    path = tuple(p.strip() for p in key.split("."))
    if not sep or len(path) < 2 or not all(path):
        raise _fail("override", text, "write section.field=value, e.g. scheduling.max_staleness=2")
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return path, value


def apply_overrides(data: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """A copy of nested tables ``data`` with every ``section.field=value`` override applied."""
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in data.items()}
    for text in overrides:
        path, value = parse_override(text)
        if path[0] not in SECTIONS:
            raise _fail("override section", path[0], "accepted: " + ", ".join(SECTIONS))
        node = out.setdefault(path[0], {})
        for part in path[1:-1]:
            child = node.get(part)
            node[part] = child = dict(child) if isinstance(child, Mapping) else {}
            node = child
        node[path[-1]] = value
    return out


def load_config(path: str | os.PathLike | None = None, overrides: Iterable[str] = (),
                *, data_size: int | None = None) -> Config:
    """Read TOML ``path`` (None: defaults), apply overrides, validate and resolve."""
    data: dict[str, Any] = {}
    if path is not None:
        where = f"config file {os.fspath(path)!r}"
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_CONFIG_BYTES + 1)
        except FileNotFoundError:
            raise ConfigError(f"{where} does not exist") from None
        except IsADirectoryError:
            raise ConfigError(f"{where} is a directory; give a TOML file") from None
        except OSError as e:
            raise ConfigError(f"{where} cannot be read: {e.strerror or e}") from None
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{where} is larger than {MAX_CONFIG_BYTES // 1024} KiB; a config is a small TOML file")
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ConfigError(f"{where} is not UTF-8 text (byte {e.start}); a config is a TOML file") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{where} is not valid TOML: {e}") from None
    data = apply_overrides(data, overrides)
    for name, fields in RETIRED.items():
        for key, why in fields.items():
            if isinstance(data.get(name), Mapping) and key in data[name]:
                raise ConfigError(f"{name}.{key} no longer exists: {why}")
    return Config.from_dict(data).resolved(data_size=data_size)
