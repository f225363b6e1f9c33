"""A run's components, built from its config: config in, components out.

:func:`build_session` turns a :class:`runtime.config.Config` into everything a run, a replay or
an audit needs — the task, the tokenizer and text codec, the initial model (after the supervised
warm start), the inference engine's shape, the train step's static config — and nothing else
reads the config's sections to build them. ``rlx run`` (``runtime.run``) only runs what this
module builds; replay and audit build the same components from the config logged in
``RunStarted``, so they see exactly what the run saw.
"""

from __future__ import annotations

import dataclasses
import os
import platform
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from runtime.config import Config, MeshShape
from runtime.errors import UsageError

Log = Callable[[str], None]


def fingerprint() -> dict:
    """The software/hardware stack the run's bits depend on (recorded in ``RunStarted``)."""
    import jax
    import jaxlib

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    device = jax.devices()[0]
    return {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "backend": jax.default_backend(),
        "device_kind": device.device_kind,
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "devices": jax.device_count(),
        "processes": jax.process_count(),
        # how a gang's ranks sum across processes (recorded only for a gang: its bits depend on it)
        **({"collectives": collectives()} if jax.process_count() > 1 else {}),
    }


def collectives() -> str:
    """How this process's sums across processes run: the CPU's implementation (gloo), else the
    backend's own (NCCL on a GPU, the inter-chip interconnect on a TPU)."""
    import jax

    backend = jax.default_backend()
    if backend == "cpu":
        return str(jax.config.values["jax_cpu_collectives_implementation"])
    return {"gpu": "nccl", "tpu": "ici"}.get(backend, backend)


def make_task(config: Config):
    """The run's task: ``data.task`` of the registry with ``data.options`` (a task that takes
    them), or the JSONL file ``data.path`` (read by the task itself when it takes a data file,
    e.g. ``codefn``; as ``jsonl`` rows otherwise). A task whose problems come from a package whose
    installed version is not ``data.task_version`` (the one the run recorded) is refused."""
    from runtime.tasks import make_task as build
    from runtime.tasks import task_class

    d = config.data
    cls = task_class(d.task)
    takes_options = getattr(cls, "takes_options", False)
    if d.options and not takes_options:
        raise UsageError(f"data.options {d.options!r} is not accepted by data.task {d.task!r}; only a "
                         "gym:<dataset> task takes options (its dataset's config, train_size, eval_size, system)")
    if takes_options and d.path is not None:
        raise UsageError(f"data.task {d.task!r} generates its problems and reads no data file, but data.path is "
                         f"{d.path!r}; leave out --data / data.path, or set data.task=jsonl")
    if d.path is not None and d.task != "jsonl" and getattr(cls, "reads_path", False):
        task = build(d.task, path=d.path, seed=config.run.seed)
    elif d.task == "jsonl" or d.path is not None:
        if d.path is None:
            raise UsageError("data.task 'jsonl' needs data.path (a JSONL file)")
        task = build("jsonl", path=d.path, eval_fraction=d.eval_fraction, seed=config.run.seed)
    else:
        task = build(d.task, seed=config.run.seed, **({"options": d.options} if takes_options else {}))
    recorded = d.task_version
    if config.episodes.tools:  # multi-turn episodes: the task's problems, answered with tools
        task = tool_task(config, task)
    if recorded is not None and task.version != recorded:
        raise UsageError(f"data.task {d.task!r}: the run was started with {task.package or 'its source'} {recorded} "
                         f"(data.task_version) but {task.version or 'no version'} is installed here, whose problems "
                         f"and scores may differ; install {task.package or 'that version'}=={recorded}")
    return task


def tool_task(config: Config, inner):
    """``inner``'s problems answered in multi-turn episodes with ``episodes.tools``, whose calls
    are read by ``episodes.rule``; a recorded ``episodes.rule_digest`` that is not this rule's is
    refused (the same ids would be read as other calls)."""
    from runtime.episodes import ToolTask, make_rule, rule_digest

    e = config.episodes
    rule = make_rule(e.rule)
    if e.rule_digest is not None and rule_digest(rule) != e.rule_digest:
        raise UsageError(f"episodes.rule {e.rule!r} reads tool calls otherwise here (sha256 {rule_digest(rule)[:16]}) "
                         f"than when the run started ({e.rule_digest[:16]}, episodes.rule_digest)")
    return ToolTask(inner, rule, e.tools, chat=config.data.chat_template, max_calls=e.max_calls,
                    turn_tokens=e.turn_tokens)


@dataclasses.dataclass(frozen=True)
class EngineShape:
    """The inference engine's static shape; the bits of every completion follow from it.

    Attributes:
      slots: sequences decoded together.
      page_size: tokens per KV cache page.
      pages_per_seq: pages one sequence of ``width`` tokens needs.
      buckets: prompt lengths prefill is compiled for.
      attention: the decode attention (``kernels.paged_attention.IMPLS``).
      model_devices: devices the engine's ``model`` axis splits it over (1: one device).
      pages: the KV pool's pages besides the null page (0: ``slots × pages_per_seq``, the worst
        case); the pool's size never changes a completion's bits.
      admission: the order queued requests take free slots (``Engine``'s ``admission``), which
        never changes a completion's bits either.
    """

    slots: int
    page_size: int
    pages_per_seq: int
    buckets: tuple[int, ...]
    attention: str = "reference"
    model_devices: int = 1
    pages: int = 0
    admission: str = "arrival"

    @classmethod
    def for_run(cls, config: Config, width: int) -> EngineShape:
        """The shape for sequences of ``width`` tokens (prompt and completion) under ``config``:
        one prefill bucket of exactly the longest prompt, so no prompt is padded past it; the
        decode attention ``workers.attention`` names, ``auto`` settled for this process's backend."""
        w = config.workers
        page_size = w.page_size
        longest_prompt = width - config.max_tokens
        attention = w.attention or "reference"
        if attention == "auto":
            import jax

            attention = "pallas" if jax.default_backend() == "tpu" else "live"
        pages_per_seq = -(-width // page_size)
        pages = config.inference.kv_pages
        if 0 < pages < pages_per_seq:
            raise UsageError(f"inference.kv_pages: {pages} is not accepted; the pool must hold one longest sequence "
                             f"({width} tokens: {pages_per_seq} pages of {page_size}), so at least {pages_per_seq}")
        return cls(min(w.inference_batch, w.inference_slots), page_size, pages_per_seq,
                   (longest_prompt,),
                   attention, MeshShape.of(config.inference.mesh).model, pages,
                   config.inference.admission or "prompt_length")

    @classmethod
    def recorded(cls, shape: Mapping[str, Any]) -> EngineShape:
        """The shape an inference worker recorded when it joined (``Engine.batch_shape``)."""
        page_size = int(shape["page_size"])
        return cls(int(shape["max_slots"]), page_size, int(shape["max_seq_len"]) // page_size,
                   tuple(int(b) for b in shape["prefill_buckets"]), str(shape.get("attention_impl", "reference")),
                   int(shape.get("mesh", {}).get("model", 1)))

    def build(self, model):
        """A new engine of this shape for ``model``."""
        from runtime.inference import Engine
        from runtime.trainer.mesh import make_mesh

        try:
            mesh = make_mesh(MeshShape(model=self.model_devices))
        except ValueError as e:
            raise UsageError(str(e).replace("trainer.mesh", "inference.mesh")) from None
        if self.attention == "ordered":  # the exact log-probs' engine
            from runtime.numerics import check_exact_backend

            check_exact_backend()
        return Engine(model, mesh=mesh, max_slots=self.slots, page_size=self.page_size,
                      num_pages=(self.pages or self.slots * self.pages_per_seq) + 1,
                      max_seq_len=self.pages_per_seq * self.page_size, prefill_buckets=self.buckets,
                      attention_impl=self.attention, admission=self.admission)


@dataclasses.dataclass
class Session:
    """Everything a run needs, built from its config (see :func:`build_session`).

    Attributes:
      config: the config it was built from.
      task: the prompts and their scoring.
      tokenizer: the model's tokenizer.
      model: the initial model (version 0), after the warm start.
      codec: text <-> token ids with the model's special tokens.
      width: tokens of the longest sequence (longest prompt + ``sampling.max_tokens``).
      shape: the inference engine's shape.
      engine: the first engine of that shape.
      step_config: the train step's static configuration.
      sandbox: the code sandbox's one-line description (level, how each limit binds), or None
        when the task runs no code.
      warm_start: what the warm start did (steps, whether it came from the cache, its checkpoint).
    """

    config: Config
    task: Any
    tokenizer: Any
    model: Any
    codec: Any
    width: int
    shape: EngineShape
    engine: Any
    step_config: Any
    sandbox: str | None
    warm_start: dict

    def new_engine(self):
        """Another engine of ``engine``'s shape (for another inference worker): the same bits."""
        return self.shape.build(self.model)


def _checkpoint_dir(config: Config) -> str:
    """``model.path``, refused unless it holds a Hugging Face checkpoint's config.json."""
    path = config.model.path
    assert path is not None
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise UsageError(f"model.path {path!r} is not a Hugging Face checkpoint directory (no config.json)")
    return path


def builtin_config(config: Config):
    """The built-in model's ``ModelConfig`` and tokenizer for ``config``'s model section (the
    tokenizer of ``TextCodec.builtin``)."""
    from runtime.model import BOS_ID, EOS_ID, PAD_ID, ModelConfig, char_tokenizer

    tokenizer = char_tokenizer()
    m = config.model
    shape = {f.name: getattr(m, f.name) for f in dataclasses.fields(m) if f.name != "path"}
    mc = ModelConfig(vocab_size=tokenizer.get_vocab_size(), bos_token_id=BOS_ID, eos_token_id=EOS_ID,
                     pad_token_id=PAD_ID, **shape)
    return mc, tokenizer


def _initial_model(config: Config):
    """The checkpoint ``model.path`` as it is, or the built-in model with fresh weights."""
    from runtime.model import load_hf

    if config.model.path is not None:
        path = _checkpoint_dir(config)
        model = load_hf(path, dtype=config.model.dtype)
        if model.tokenizer is None:
            raise UsageError(f"model.path {path!r} has no tokenizer.json")
        return model
    import jax
    import jax.numpy as jnp

    from runtime import rng
    from runtime.inference.sampling import seed_key_data
    from runtime.model import Model

    mc, tokenizer = builtin_config(config)
    key = jax.random.wrap_key_data(jnp.asarray(seed_key_data(rng.derive_seed(config.run.seed, rng.MODEL_INIT))),
                                   impl="threefry2x32")
    return Model.init(mc, key=key, tokenizer=tokenizer)


def build_codec(config: Config):
    """The model's text codec from its config and tokenizer files alone: no weights are read or
    initialized, nothing is compiled. The same codec as ``build_session(config).codec``.

    A checkpoint's codec follows its own files (``runtime.model.hf_text``); with
    ``data.chat_template`` it renders prompts with the checkpoint's chat template, which must be
    the one whose digest the config records when it records one (a replay or resume).
    """
    from runtime.tasks.base import TextCodec

    d = config.data
    if config.model.path is None:
        if d.chat_template:
            raise UsageError("data.chat_template is true but the built-in model has no chat template; give a "
                             "checkpoint with one (--model / model.path) or set data.chat_template=false")
        codec = TextCodec.builtin()
    else:
        codec = _checkpoint_codec(config)
    if d.max_prompt_tokens is not None:
        codec = dataclasses.replace(codec, max_prompt_tokens=d.max_prompt_tokens)
    recorded, recorded_file = d.chat_template_digest, d.chat_template_file
    if recorded is not None and codec.template_digest != recorded:
        raise UsageError(f"the chat template of model.path {config.model.path!r} (sha256 {codec.template_digest}, "
                         f"from {codec.template_file}) is not the one the run was started with (data.chat_template_digest "
                         f"{recorded}, from {recorded_file or 'tokenizer_config.json'}): its prompts would differ; restore "
                         f"the checkpoint's {recorded_file or 'tokenizer_config.json'}")
    return codec


def _checkpoint_codec(config: Config):
    from runtime.model.checkpoint_files import read_json
    from runtime.model.hf import CONFIG_FILE
    from runtime.model.hf_text import checkpoint_text
    from runtime.tasks.base import TextCodec

    path = _checkpoint_dir(config)
    hf = read_json(path, CONFIG_FILE)  # bounded: size, UTF-8, nesting, finite numbers, not a link
    if hf is None:
        raise UsageError(f"model.path {path!r} is not a Hugging Face checkpoint directory (no config.json)")
    return TextCodec.for_checkpoint(checkpoint_text(path, hf, chat_template=config.data.chat_template))


# Above this many prompts a subword tokenizer's counts are not taken one by one.
MAX_SCANNED_PROMPTS = 1 << 17


def longest_prompt(config: Config, task, codec, positions: int) -> int:
    """The longest prompt of ``task`` in ``codec``'s tokens, within ``data.max_prompt_tokens`` and
    the model's ``positions`` less ``sampling.max_tokens``; a prompt over that limit is a one-line
    error naming it."""
    max_tokens = config.max_tokens
    room = positions - max_tokens
    cap = config.data.max_prompt_tokens
    if cap is not None and cap > room:
        raise UsageError(f"data.max_prompt_tokens {cap} plus sampling.max_tokens {max_tokens} exceeds the model's "
                         f"{positions} positions (max_position_embeddings); it must be <= {room}")
    if room < 1:
        raise UsageError(f"sampling.max_tokens {max_tokens} is too large for this model: it leaves no room for a "
                         f"prompt in its {positions} positions (max_position_embeddings)")
    limit = room if cap is None else cap
    why = (f"max_position_embeddings {positions} less sampling.max_tokens {max_tokens}" if cap is None
           else "data.max_prompt_tokens")
    prompts = task.train_size + task.eval_size
    if not codec.char_level and prompts > MAX_SCANNED_PROMPTS and config.data.path is None:
        if cap is None:
            raise UsageError(f"task {task.name!r} has {prompts} prompts, too many to count in this tokenizer's "
                             "tokens one by one; set data.max_prompt_tokens to the most tokens a prompt may have")
        return cap  # the codec refuses a longer prompt when it is encoded
    longest = task.max_prompt_tokens(codec, limit=limit, why=why)
    if longest > limit:
        if cap is None:
            raise UsageError(f"sampling.max_tokens {max_tokens} is too large for this model: the longest prompt "
                             f"({longest} tokens) plus it exceeds its {positions} positions (max_position_embeddings); "
                             f"it must be <= {positions - longest}")
        raise UsageError(f"the prompts of task {task.name!r} have up to {longest} tokens, more than "
                         f"data.max_prompt_tokens {cap}")
    return longest


def step_config(config: Config, model):
    """The train step's static configuration for ``config`` and ``model``: its ``trainer``
    section's (``StepConfig.of``), with the run's objective and sampling temperature and group size, and
    a completion window of ``sampling.max_tokens`` positions with ``trainer.completion_logits``."""
    from runtime.trainer.step import StepConfig

    step = StepConfig.of(config.trainer, model=model.config, objective=config.objective(),
                         temperature=config.sampling.temperature, group_size=config.sampling.group_size)
    if config.trainer.exact_logprobs:  # the engine's bits for its pages
        step = dataclasses.replace(step, exact_block=config.workers.page_size)
    if config.trainer.completion_logits:
        step = dataclasses.replace(step, completion_window=config.max_tokens)
    return step


def trainer_mesh(config: Config):
    """The trainer's device mesh for ``trainer.mesh`` (None: one device); a mesh larger than
    this process's devices is a one-line error."""
    from runtime.trainer.mesh import make_mesh

    try:
        return make_mesh(MeshShape.of(config.trainer.mesh))
    except ValueError as e:
        raise UsageError(str(e)) from None


def make_trainer(session: Session, store, worker_id: str, *, gang=None, replay: bool = False):
    """The run's ``StepTrainer`` on ``store``: the step, batch shape and parents kept its config
    says, on the ``trainer.mesh`` (summing gradients in a fixed order with
    ``trainer.deterministic_reduction``), as one rank of ``gang`` if given. A trainer that is not
    the gang ``workers.trainer_processes`` asks for is a one-line error, except in a ``replay``,
    which retrains in one process (with the gang's device count, the same bits) and publishes each
    version without its optimizer state (the replay's store holds what the steps after it read)."""
    from runtime.trainer.gang import check_devices
    from runtime.workers import StepTrainer

    config = session.config
    processes = config.workers.trainer_processes
    if not replay and (1 if gang is None else gang.size) != processes:
        raise UsageError(
            f"this run trains with a gang of workers.trainer_processes={processes} processes but this trainer is "
            f"{'one process' if gang is None else f'a gang of {gang.size}'}: start each rank as "
            f"rlx worker trainer --gang RANK/{processes} --coordinator HOST:PORT" if processes > 1 else
            f"this run trains in one process (workers.trainer_processes=1) but this trainer is a gang of {gang.size}"
        )
    mesh = trainer_mesh(config)
    check_devices(gang, 1 if mesh is None else mesh.size)
    step = session.step_config
    if mesh is not None:  # micro-batches take a share of every row shard
        step = dataclasses.replace(step, row_shards=mesh.shape["data"] * mesh.shape["fsdp"])
    if config.trainer.deterministic_reduction and mesh is not None:
        step = dataclasses.replace(step, fixed_order_mesh=mesh)
    if step.exact_block > 0:
        from runtime.numerics import check_exact_backend

        check_exact_backend()
    return StepTrainer(worker_id, session.model, session.task, session.codec, store, step,
                       group_size=config.sampling.group_size, width=session.width,
                       keep_parents=config.scheduling.max_staleness, mesh=mesh, gang=gang,
                       store_opt_state=not replay)


def resolve(config: Config, task) -> Config:
    """``config`` with every choice explicit (``Config.resolved``) for its ``task`` (its size and
    its source's version) and its model's chat template: what ``RunStarted`` records, and what
    everything is built from."""
    codec = build_codec(config)
    spec = config.verifier.reward
    reward = None if spec is None else load_reward(spec, config.verifier.reward_digest).digest
    rule = getattr(task, "rule", None) if getattr(task, "multi_turn", False) else None
    if rule is not None:
        from runtime.episodes import rule_digest

        config = dataclasses.replace(config, episodes=dataclasses.replace(config.episodes, rule_digest=rule_digest(rule)))
    return config.resolved(data_size=task.train_size, chat_template_digest=codec.template_digest,
                           chat_template_file=codec.template_file, task_version=task.version, reward_digest=reward)


def run_fingerprint(session: Session, inputs: dict | None = None, *, layout=None) -> dict:
    """What ``RunStarted`` records of this machine: the stack the bits depend on, the trainer's
    layout (its processes, the devices of each, its mesh and, for a gang, the collectives that sum
    across processes: the workers this process starts get its environment), for a task that
    runs code, the sandbox's isolation and how each limit binds, and the run's input files by
    absolute path and content digest (``runtime.inputs.record``; ``inputs`` if already taken).
    ``rlx resume`` warns when any of it but the inputs differs, and refuses changed inputs. With
    ``layout`` (``runtime.placement.Layout``), the devices of each of the run's processes."""
    import jax

    from runtime import inputs as run_inputs

    processes = session.config.workers.trainer_processes
    trainer = {
        "processes": processes, "devices_per_process": jax.local_device_count(),
        "mesh": MeshShape.of(session.config.trainer.mesh).describe(),
        "collectives": jax.config.values["jax_cpu_collectives_implementation"] if processes > 1 else None,
    }
    return {**fingerprint(), "trainer": trainer, **({} if session.sandbox is None else {"sandbox": session.sandbox}),
            **({} if layout is None else {"layout": layout.to_json()}),
            "inputs": run_inputs.record(session.config) if inputs is None else inputs}


def load_reward(spec: str, recorded: str | None):
    """The user's reward file ``spec`` (``verifier.reward``, a ``verifiers.reward.RewardModule``),
    refused in one line when it is not the one whose digest ``recorded`` the run's config records
    (``verifier.reward_digest``; None: none yet)."""
    from verifiers.reward import RewardModule

    module = RewardModule.load(spec)
    if recorded is not None and module.digest != recorded:
        raise UsageError(f"verifier.reward: {module.path} has changed since the run started (sha256 {module.digest}, "
                         f"the run recorded {recorded} in verifier.reward_digest); restore it")
    return module


def build_task(config: Config, *, judge: bool = True, log: Log = print) -> tuple[Any, str | None]:
    """The run's task and, with ``judge``, its sandboxed code verifier when it has code tests, or
    the user's reward function (``verifier.reward``) in the sandbox, called once to check it: a
    refused isolation level or a reward that does not work stops the run before anything is
    trained. Returns (task, the sandbox's one-line description or None), which ``build_session``
    takes as ``built``."""
    task = make_task(config)
    sandbox = None
    reward, recorded = config.verifier.reward, config.verifier.reward_digest
    module = load_reward(reward, recorded) if judge and reward is not None else None  # read before the sandbox
    python_tool = "python" in getattr(task, "tools", ())  # a multi-turn task's Python tool runs in the sandbox
    if judge and (task.has_code or module is not None or python_tool):  # the isolation is settled before anything is trained
        from verifiers.code import CodeVerifier, WeakIsolationRefused

        try:
            code_verifier = CodeVerifier(isolation=config.verifier.isolation, slots=config.verifier.slots)
        except WeakIsolationRefused:
            from verifiers.code.sandbox import probe_namespaces

            raise UsageError(f"verifier.isolation 'auto' found only the weak 'rlimits' level here "
                             f"({probe_namespaces()}), under which programs see the host's files, processes and "
                             "network; set verifier.isolation=\"rlimits\" to accept it") from None
        sandbox = code_verifier.sandbox.describe()
        log(f"code sandbox: {sandbox}")
        if module is None:
            task.code_verifier = code_verifier
        else:
            from runtime.tasks.reward import UserReward
            from verifiers.reward import RewardVerifier

            task = UserReward(task, RewardVerifier(module, code_verifier.sandbox))
            task.check()
    return task, sandbox


def build_scoring(config: Config, *, log: Log = print):
    """What a verifier needs to score completions — the task with its code verifier, and the
    codec — without the model or an engine: (task, codec)."""
    task, _ = build_task(config, judge=True, log=log)
    return task, build_codec(config)


def build_session(config: Config, *, log: Log = print, judge: bool = True, warm: bool = True,
                  warm_checkpoint: bool = False, built: tuple[Any, str | None] | None = None,
                  engine: bool = True, progress: bool = False) -> Session:
    """Task, tokenizer, initial model (after the supervised warm start), engine and step config.

    With ``judge`` a task with code tests gets its sandboxed code verifier now, so a refused
    isolation level stops the run before anything is trained; a replay, which re-trains from
    logged outcomes and judges nothing, passes False. Without ``warm`` the model keeps its
    initial weights: for a worker that reads every version it uses from the parameter store.
    A ``model.path`` checkpoint is used as it is unless ``warm_checkpoint`` (``rlx pretrain``).
    ``built``: what ``build_task`` returned for this config, if it was called already. Without
    ``engine`` no engine is built (``Session.engine`` is None; ``new_engine`` still builds one):
    for a replay that re-trains and samples nothing. With ``progress`` a warm start that trains
    shows its steps on stderr.
    """
    from runtime.trainer.pretrain import cached_warm_start

    task, sandbox = build_task(config, judge=judge, log=log) if built is None else built
    codec = build_codec(config)  # the checkpoint's text files are checked before its weights are read
    model = _initial_model(config)
    positions = model.config.max_position_embeddings
    width = longest_prompt(config, task, codec, positions) + config.max_tokens
    model.config.check_sequence_length(width)
    warm_start: dict = {"steps": 0, "cached": False}
    p = config.pretrain
    if warm and p.steps > 0 and (config.model.path is None or warm_checkpoint):
        cache_dir = p.cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "rlx", "warm_start")
        model, path, cached = cached_warm_start(model, task, codec, p, seed=config.run.seed, width=width,
                                                cache_dir=cache_dir, log=log, progress=progress)
        warm_start = {"steps": p.steps, "cached": cached, "checkpoint": path}
    shape = EngineShape.for_run(config, width)
    return Session(config, task, model.tokenizer, model, codec, width, shape, shape.build(model) if engine else None,
                   step_config(config, model), sandbox, warm_start)


__all__ = ["EngineShape", "Session", "build_codec", "build_session", "fingerprint", "load_reward", "longest_prompt",
           "make_task", "resolve", "run_fingerprint", "step_config"]
