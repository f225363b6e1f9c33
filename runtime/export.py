"""A trained version of a run as a Hugging Face checkpoint (``rlx export``).

The run's ledger says which versions exist and what their weights' digests are; its parameter
store holds the weights; the run's logged config (``RunStarted``) says which model they belong
to. The export writes ``config.json``, the weights as safetensors (sharded above a size, as
Transformers does) and the tokenizer files into a new directory, which Transformers and
``rlx run --model`` load:

- a run started from a checkpoint (``model.path``) gets that checkpoint's ``config.json`` and its
  tokenizer, chat template and generation files copied, and each tensor in the dtype the
  checkpoint stored it in, so version 0 gives back the checkpoint's tensors bit for bit; every
  file keeps its source's permission bits, and a checkpoint file that is a link (or an index's
  shard name that leaves the directory) is refused, so an export never copies a file from
  elsewhere (``runtime.model.checkpoint_files``);
- a run of the built-in model gets the config its ``ModelConfig`` maps to, the character
  tokenizer's ``tokenizer.json`` and a ``generation_config.json`` with its special tokens and
  greedy decoding of the run's ``sampling.max_tokens``, in the dtype the parameters were trained
  in.

Either way the exported tokenizer starts a prompt as rlx did (``runtime.export_text``): the
built-in model's with ``<bos>``; a checkpoint's tokenizer files are rewritten only where
Transformers would otherwise add a BOS token rlx did not (or omit one it did).

``dtype`` overrides the tensors' dtype (e.g. ``float32`` keeps the trained master weights of a
``bfloat16`` checkpoint exactly). The directory is written beside ``out`` and renamed into place
when complete, so an interrupted export leaves no half checkpoint at ``out``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from runtime.errors import UsageError
from runtime.rundir import RunDir, run_started

# The module is imported by ``rlx --help``: the model code (JAX) is imported where it is used.

EXPORT_DTYPES = ("float32", "bfloat16", "float16")
_WEIGHTS = "*.safetensors"


@dataclasses.dataclass(frozen=True)
class Exported:
    """What ``export_version`` wrote.

    Attributes:
      run_id: the run.
      version: the exported version.
      digest: its weights' digest (the ledger's, checked against the stored weights).
      out: the checkpoint directory.
      files: the files written, by name.
      source: the checkpoint the run started from, or ``"built-in"``.
      dtypes: the tensors' dtypes, sorted.
    """

    run_id: str
    version: int
    digest: str
    out: str
    files: tuple[str, ...]
    source: str
    dtypes: tuple[str, ...]


def _describe(versions: Sequence[int]) -> str:
    if not versions:
        return "none"
    if len(versions) <= 12:
        return ", ".join(map(str, versions))
    return f"{', '.join(map(str, versions[:3]))}, …, {', '.join(map(str, versions[-5:]))} ({len(versions)} versions)"


def _check_out(out: pathlib.Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        what = "is not empty" if out.is_dir() else "is not a directory"
        raise UsageError(f"--out {str(out)!r} exists and {what}; give a new or empty directory")


def _published(store, run_id: str) -> tuple[dict[int, Any], set[int]]:
    """The run's ``WeightsPublished`` by version and the versions ``VersionsRetired`` names; only
    those two kinds of record are decoded."""
    from ledger import events as ev
    from ledger.codec import decode_body

    kinds = (ev.WeightsPublished.KIND, ev.VersionsRetired.KIND)
    published: dict[int, Any] = {}
    retired: set[int] = set()
    for record in store.scan(run_id):
        if record.kind not in kinds:
            continue
        event = decode_body(record.kind, record.version, record.body, store.registry)
        if isinstance(event, ev.WeightsPublished):
            published[event.version] = event
        elif isinstance(event, ev.VersionsRetired):
            retired.update(int(v) for v in event.versions)
    return published, retired


@dataclasses.dataclass(frozen=True)
class _Form:
    """The Hugging Face form of a run's model: its ``ModelConfig``, ``config.json``, the dtype of
    each tensor by name (None: as stored), the files to write beside the weights (``copies``: names
    of the source checkpoint's files, copied as they are) and the permission bits the written files
    keep from the source (by name; ``_WEIGHTS`` for every weights file)."""

    model: Any
    hf_config: dict[str, Any]
    dtypes: Mapping[str, str] | None
    copies: tuple[str, ...]
    texts: Mapping[str, str]
    source: str
    modes: Mapping[str, int] = dataclasses.field(default_factory=dict)


def builtin_form(model_config, tokenizer, run_id: str, *, max_tokens: int | None = None) -> _Form:
    """The form of the built-in model: its config mapped to Hugging Face's, the character
    tokenizer's files (its post-processor starting a prompt with ``<bos>``, as rlx's codec does)
    and a generation config of its special tokens and greedy decoding (rlx's held-out evaluation)
    of at most ``max_tokens`` new tokens (the run's ``sampling.max_tokens``)."""
    from runtime.export_text import aligned_text_files
    from runtime.model.hf import GENERATION_CONFIG_FILE, tokenizer_config
    from runtime.model.hf_convert import config_to_hf

    try:
        hf_config = config_to_hf(model_config)
    except UsageError as e:
        raise UsageError(f"run {run_id!r} trained a built-in model that has no Hugging Face form: {e}") from e
    generation: dict[str, Any] = {
        key: getattr(model_config, key)
        for key in ("bos_token_id", "eos_token_id", "pad_token_id")
        if getattr(model_config, key) is not None
    }
    generation["do_sample"] = False
    if max_tokens is not None:
        generation["max_new_tokens"] = max_tokens
    texts = {
        GENERATION_CONFIG_FILE: json.dumps(generation, indent=2) + "\n",
        **aligned_text_files(tokenizer, tokenizer_config(tokenizer), model_config.bos_token_id),
    }
    return _Form(model_config, hf_config, None, (), texts, "built-in")


def _checkpoint_form(path: str, run_id: str) -> _Form:
    from runtime.model.checkpoint_files import checkpoint_file, file_mode, read_json
    from runtime.model.hf import CONFIG_FILE, TOKENIZER_FILES, weight_dtypes, weight_modes
    from runtime.model.hf_convert import config_from_hf

    directory = pathlib.Path(path)
    hf_config = read_json(directory, CONFIG_FILE) if directory.is_dir() else None
    if hf_config is None:
        raise UsageError(f"run {run_id!r} started from the checkpoint {path!r}, which has no {CONFIG_FILE} any more; "
                         "its config and tokenizer files are exported with the weights")
    model_config = config_from_hf(hf_config, source=str(directory / CONFIG_FILE))
    copies = tuple(name for name in TOKENIZER_FILES if checkpoint_file(directory, name) is not None)
    modes = {CONFIG_FILE: file_mode(directory, CONFIG_FILE), _WEIGHTS: weight_modes(directory)}
    texts = _template_for_older_readers(directory)
    texts.update(_bos_as_rlx(directory, hf_config, texts))
    return _Form(model_config, hf_config, weight_dtypes(directory), tuple(n for n in copies if n not in texts), texts,
                 str(directory), {name: mode for name, mode in modes.items() if mode is not None})


def _template_for_older_readers(directory: pathlib.Path) -> dict[str, str]:
    """``{"tokenizer_config.json": text}`` with the checkpoint's ``chat_template.jinja`` added as its
    ``chat_template`` entry, where the checkpoint keeps its template only in that file (as current
    Transformers saves it): Transformers before the file existed read the entry, current Transformers
    the file, and both get the same text. Nothing (the files are copied as they are) otherwise."""
    from runtime.model.checkpoint_files import read_json
    from runtime.model.hf_text import CHAT_TEMPLATE_FILE, TOKENIZER_CONFIG_FILE, read_chat_template

    tok_config = read_json(directory, TOKENIZER_CONFIG_FILE)
    if tok_config is None or "chat_template" in tok_config:
        return {}
    found = read_chat_template(directory, tok_config)
    if found is None or found[1] != CHAT_TEMPLATE_FILE:
        return {}
    return {TOKENIZER_CONFIG_FILE: json.dumps({**tok_config, "chat_template": found[0]}, indent=2, ensure_ascii=False) + "\n"}


def _bos_as_rlx(directory: pathlib.Path, hf_config: Mapping[str, Any], texts: Mapping[str, str]) -> dict[str, str]:
    """The tokenizer files rewritten where Transformers' tokenizer would start a prompt otherwise
    than rlx does with this checkpoint (``runtime.export_text``); nothing where they agree."""
    from runtime.export_text import aligned_text_files
    from runtime.model.checkpoint_files import read_json
    from runtime.model.hf_text import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, checkpoint_text

    if (directory / TOKENIZER_FILE).is_file():
        text = checkpoint_text(directory, hf_config)
        written = texts.get(TOKENIZER_CONFIG_FILE)
        tok_config = json.loads(written) if written is not None else read_json(directory, TOKENIZER_CONFIG_FILE) or {}
        return aligned_text_files(text.tokenizer, tok_config, text.bos_id)
    return {}


def _form(logged: Mapping[str, Any], run_id: str) -> _Form:
    from runtime.config import Config

    config = Config.from_dict(dict(logged))
    if config.model.path is not None:
        return _checkpoint_form(config.model.path, run_id)
    from runtime.session import builtin_config

    model_config, tokenizer = builtin_config(config)
    return builtin_form(model_config, tokenizer, run_id, max_tokens=config.max_tokens)


def _check_shapes(params, model_config, run_id: str, source: str) -> None:
    """Refuse weights whose tree the model's config does not describe (a replaced checkpoint)."""
    import jax

    from runtime.model.transformer import init_params
    from runtime.params.tree import path_string

    def shapes(tree) -> dict[str, tuple[int, ...]]:
        leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
        return {path_string(path): tuple(leaf.shape) for path, leaf in leaves}

    want = shapes(jax.eval_shape(lambda: init_params(model_config, key=jax.random.key(0))))
    got = shapes(params)
    if want != got:
        differ = sorted(set(want) ^ set(got) | {p for p in set(want) & set(got) if want[p] != got[p]})
        raise UsageError(f"the weights of run {run_id!r} do not fit the model config of {source} "
                         f"(first difference: {differ[0]}); was the checkpoint replaced?")


def _tensors(params, form: _Form, dtype: str | None) -> dict[str, Any]:
    import jax.numpy as jnp

    from runtime.model.hf_convert import params_to_hf

    tensors = params_to_hf(params, form.model)
    for name, value in tensors.items():
        want = dtype or (form.dtypes or {}).get(name)
        if want is not None and value.dtype != jnp.dtype(want):
            tensors[name] = value.astype(want)
    return tensors


def _write(out: pathlib.Path, form: _Form, tensors: dict[str, Any], dtype: str | None,
           max_shard_bytes: int | None) -> tuple[str, ...]:
    from runtime.model.checkpoint_files import copy_file
    from runtime.model.hf import CONFIG_FILE, DEFAULT_SHARD_BYTES, write_weights

    max_shard_bytes = DEFAULT_SHARD_BYTES if max_shard_bytes is None else max_shard_bytes
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".export", dir=out.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)
        hf_config = dict(form.hf_config)
        if dtype is not None:
            for key in [k for k in ("torch_dtype", "dtype") if k in hf_config] or ["dtype"]:
                hf_config[key] = dtype
        (staging / CONFIG_FILE).write_text(json.dumps(hf_config, indent=2) + "\n")
        files = [CONFIG_FILE, *write_weights(staging, tensors, max_shard_bytes=max_shard_bytes)]
        for name in files:
            mode = form.modes.get(CONFIG_FILE if name == CONFIG_FILE else _WEIGHTS)
            if mode is not None:
                (staging / name).chmod(mode)
        for name in form.copies:
            if not copy_file(form.source, name, staging):
                raise UsageError(f"{pathlib.Path(form.source) / name} was removed while the export read the checkpoint")
            files.append(name)
        for name, text in form.texts.items():
            (staging / name).write_text(text)
            files.append(name)
        os.replace(staging, out)  # onto a missing or empty directory
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return tuple(sorted(files))


def export_version(directory: str, version: int, out: str | os.PathLike, *, run_id: str | None = None,
                   dtype: str | None = None, max_shard_bytes: int | None = None) -> Exported:
    """Write version ``version`` of the run in ``directory`` as a Hugging Face checkpoint ``out``.

    Args:
      directory: the run directory.
      version: a version the run published and still keeps in its parameter store.
      out: a new (or empty) directory.
      run_id: the run, when the ledger holds several.
      dtype: the tensors' dtype (one of ``EXPORT_DTYPES``); None: the starting checkpoint's dtype
        of each tensor, or the trained dtype for the built-in model.
      max_shard_bytes: weights above this size are split into shards (default: as
        ``runtime.model.hf.save_hf``).

    Raises:
      UsageError: ``out`` is not empty, the version is unknown or retired, its stored weights do
        not have the ledger's digest, the model has no Hugging Face form, or the checkpoint the
        run started from is gone.
    """
    from ledger import open_store
    from runtime.params import params_digest
    from runtime.replay.source import open_params

    out_path = pathlib.Path(out)
    _check_out(out_path)
    if dtype is not None and dtype not in EXPORT_DTYPES:
        raise UsageError(f"--dtype {dtype!r}: accepted: {', '.join(EXPORT_DTYPES)}")
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise UsageError(f"--version {version!r}: versions are integers >= 0")
    rundir = RunDir(directory)
    rundir.check_exists()
    with open_store(directory, readonly=True) as store:
        run_id = rundir.select_run(store, run_id)
        started = run_started(store, run_id)
        published, retired = _published(store, run_id)
    pub = published.get(version)
    if pub is None:
        raise UsageError(f"version {version} is not a version of run {run_id!r}; "
                         f"it published {_describe(sorted(published))}")
    form = _form(started.config, run_id)
    url = rundir.logged_params(started.config)
    pstore = open_params(url)
    stored = set() if pstore is None else set(pstore.versions())
    if version in retired or version not in stored:
        kept = sorted(v for v in published if v in stored and v not in retired)
        raise UsageError(f"version {version} of run {run_id!r} was retired from its parameter store {url}; "
                         f"kept versions: {_describe(kept)}")
    assert pstore is not None
    params = pstore.get(version)
    digest = params_digest(params)
    if digest != pub.digest:
        raise UsageError(f"stored version {version} of run {run_id!r} has digest {digest[:16]}…, "
                         f"but the ledger published {pub.digest[:16]}…; not exporting it")
    _check_shapes(params, form.model, run_id, form.source)
    tensors = _tensors(params, form, dtype)
    files = _write(out_path, form, tensors, dtype, max_shard_bytes)
    return Exported(run_id, version, digest, str(out_path), files, form.source,
                    tuple(sorted({t.dtype.name for t in tensors.values()})))


__all__ = ["EXPORT_DTYPES", "Exported", "builtin_form", "export_version"]
