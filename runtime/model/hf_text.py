"""The text side of a Hugging Face checkpoint: tokenizer, special tokens and chat template.

Read with the ``tokenizers`` library and plain JSON, never ``transformers``:

- ``tokenizer.json``: the tokenizer itself;
- ``tokenizer_config.json`` (and ``special_tokens_map.json``): the special token strings,
  ``add_bos_token`` and ``chat_template``;
- ``chat_template.jinja`` (where current Transformers saves the template) and ``chat_template.json``
  (``{"chat_template": ...}``, an older processor's file): the chat template, with Transformers'
  precedence — ``chat_template.jinja``, then ``chat_template.json``, then ``tokenizer_config.json``;
- ``config.json`` and ``generation_config.json``: the special token ids.

Each architecture starts a prompt as its own tokenizer does: Llama and Mistral prepend the BOS
token, Qwen2 and Qwen3 prepend nothing (their ``config.json`` names a ``bos_token_id`` that the
tokenizer never adds); an explicit ``add_bos_token`` in ``tokenizer_config.json`` wins. The BOS
id is ``config.json``'s ``bos_token_id``, else the tokenizer's ``bos_token``. Every
end-of-sequence id named by ``config.json`` or ``generation_config.json`` (often several, e.g.
end-of-turn and end-of-text) ends a completion; the tokenizer's ``eos_token`` when neither names
one. Padding uses the tokenizer's pad token, else ``config.json``'s or
``generation_config.json``'s ``pad_token_id``, else the first end-of-sequence id: padded positions
are masked out of attention and loss, so any id is safe there.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Mapping
from typing import Any

from tokenizers import Tokenizer

from runtime.config import CHAT_TEMPLATE_FILES
from runtime.errors import UsageError
from runtime.model.chat_template import MAX_TEMPLATE_CHARS, ChatTemplate, select_template
from runtime.model.checkpoint_files import copy_file, read_bytes, read_json

TOKENIZER_FILE = "tokenizer.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
GENERATION_CONFIG_FILE = "generation_config.json"
# Where a chat template is read from, first found first (Transformers' order; ``data.chat_template_file``).
TEMPLATE_FILES = CHAT_TEMPLATE_FILES
CHAT_TEMPLATE_FILE, CHAT_TEMPLATE_JSON_FILE, TOKENIZER_CONFIG_FILE = TEMPLATE_FILES
TEXT_FILES = (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_MAP_FILE, GENERATION_CONFIG_FILE,
              CHAT_TEMPLATE_FILE, CHAT_TEMPLATE_JSON_FILE)
MAX_TOKENIZER_BYTES = 512 << 20
# Architectures whose tokenizer starts no prompt with BOS; the others (llama, mistral) do.
NO_BOS = frozenset({"qwen2", "qwen3"})
SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


@dataclasses.dataclass(frozen=True)
class CheckpointText:
    """How a checkpoint turns text into token ids and back.

    Attributes:
      tokenizer: the ``tokenizers.Tokenizer`` of ``tokenizer.json``.
      bos_id: the id prepended to a plain prompt, or None when the architecture adds none.
      eos_ids: every id that ends a completion; the first ends a supervised target.
      pad_id: the id padded positions hold.
      chat_template: the compiled chat template (its ``origin`` the file it came from), or None.
    """

    tokenizer: Tokenizer
    bos_id: int | None
    eos_ids: tuple[int, ...]
    pad_id: int
    chat_template: ChatTemplate | None


def _optional_json(directory: pathlib.Path, name: str) -> dict[str, Any]:
    return read_json(directory, name) or {}


def _token_string(value: Any) -> str | None:
    """A special token entry: a string, or an ``AddedToken`` object with its ``content``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _ids(value: Any, where: str) -> list[int]:
    """Token ids of a config entry: an id, a list of ids, or null."""
    values = value if isinstance(value, list) else [] if value is None else [value]
    if not all(type(v) is int and v >= 0 for v in values):
        raise UsageError(f"{where}: {value!r} is not accepted; it must be a token id or a list of token ids")
    return values


def read_chat_template(directory: str | os.PathLike, tok_config: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(template text, file name)`` of the checkpoint's chat template, from the first of
    ``TEMPLATE_FILES`` that holds one; None when none does. A template file that is not UTF-8, is
    empty or is too large is a one-line error naming it."""
    root = pathlib.Path(directory)
    data = read_bytes(root, CHAT_TEMPLATE_FILE, max_bytes=4 * MAX_TEMPLATE_CHARS)
    if data is not None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UsageError(f"{root / CHAT_TEMPLATE_FILE} is not UTF-8 text (byte {e.start}); a chat template is "
                             "UTF-8") from None
        return select_template(text, source=str(root / CHAT_TEMPLATE_FILE)), CHAT_TEMPLATE_FILE
    for name, entries in ((CHAT_TEMPLATE_JSON_FILE, _optional_json(root, CHAT_TEMPLATE_JSON_FILE)),
                          (TOKENIZER_CONFIG_FILE, tok_config)):
        value = entries.get("chat_template")
        if value is not None:
            return select_template(value, source=str(root / name)), name
    return None


def load_tokenizer(directory: str | os.PathLike) -> Tokenizer:
    """``tokenizer.json`` of ``directory`` (one-line errors when absent, too large or unreadable)."""
    path = pathlib.Path(directory) / TOKENIZER_FILE
    data = read_bytes(directory, TOKENIZER_FILE, max_bytes=MAX_TOKENIZER_BYTES)
    if data is None:
        raise UsageError(f"model.path {str(directory)!r} has no {TOKENIZER_FILE}")
    try:
        return Tokenizer.from_str(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise UsageError(f"{path} is not UTF-8 text (byte {e.start}); a tokenizer.json is UTF-8") from None
    except Exception as e:  # the tokenizers library raises plain Exceptions for malformed files
        raise UsageError(f"{path} could not be read by the tokenizers library: {' '.join(str(e).split())}") from None


def checkpoint_text(directory: str | os.PathLike, hf_config: Mapping[str, Any], *,
                    chat_template: bool = False) -> CheckpointText:
    """The tokenizer, special ids and (with ``chat_template``) the chat template of a checkpoint.

    Args:
      directory: the checkpoint directory.
      hf_config: its ``config.json`` as a dict.
      chat_template: compile the chat template (``read_chat_template``); its absence is an error.

    Raises:
      UsageError: a file is missing or malformed, an id is out of range, the architecture prepends
        a BOS token the checkpoint does not name, no end-of-sequence id is named, or a chat template
        is asked for and there is none.
    """
    root = pathlib.Path(directory)
    tokenizer = load_tokenizer(root)
    tok_config = _optional_json(root, TOKENIZER_CONFIG_FILE)
    special_map = _optional_json(root, SPECIAL_TOKENS_MAP_FILE)
    generation = _optional_json(root, GENERATION_CONFIG_FILE)
    vocab = hf_config.get("vocab_size") or tokenizer.get_vocab_size()
    if type(vocab) is not int or vocab < 0:
        raise UsageError(f"{root / 'config.json'}: vocab_size={vocab!r} is not accepted; it must be a positive integer")
    strings = {}
    for name in SPECIAL_NAMES:
        text = _token_string(tok_config.get(name)) or _token_string(special_map.get(name))
        if text is not None:
            strings[name] = text

    def token_id(name: str) -> int | None:
        text = strings.get(name)
        return None if text is None else tokenizer.token_to_id(text)

    def checked(ids: list[int], where: str) -> list[int]:
        bad = [i for i in ids if i >= vocab]
        if bad:
            raise UsageError(f"{where}: token ids {bad} are not in [0, {vocab}) (vocab_size)")
        return ids

    arch = hf_config.get("model_type")
    add_bos = tok_config.get("add_bos_token")
    if not isinstance(add_bos, bool):
        add_bos = arch not in NO_BOS
    bos_id = None
    if add_bos:
        config_bos = checked(_ids(hf_config.get("bos_token_id"), f"{root / 'config.json'} bos_token_id"),
                             f"{root / 'config.json'} bos_token_id")
        bos_id = config_bos[0] if config_bos else token_id("bos_token")
        if bos_id is None:
            raise UsageError(f"model.path {str(directory)!r}: a {arch} tokenizer starts prompts with a BOS token, "
                             "but neither config.json (bos_token_id) nor tokenizer_config.json (bos_token) names one; "
                             "name it, or set add_bos_token=false in tokenizer_config.json")

    eos: list[int] = []
    for where, value in ((root / "config.json", hf_config.get("eos_token_id")),
                         (root / GENERATION_CONFIG_FILE, generation.get("eos_token_id"))):
        eos += checked(_ids(value, f"{where} eos_token_id"), f"{where} eos_token_id")
    tokenizer_eos = token_id("eos_token")
    if not eos and tokenizer_eos is not None:
        eos.append(tokenizer_eos)
    eos_ids = tuple(dict.fromkeys(eos))  # first occurrence first: config.json's id ends a target
    if not eos_ids:
        raise UsageError(f"model.path {str(directory)!r} names no end-of-sequence token: set eos_token_id in "
                         f"config.json or {GENERATION_CONFIG_FILE}, or eos_token in {TOKENIZER_CONFIG_FILE}")

    pad_id = token_id("pad_token")
    for where, value in ((root / "config.json", hf_config.get("pad_token_id")),
                         (root / GENERATION_CONFIG_FILE, generation.get("pad_token_id"))):
        if pad_id is None:
            pads = checked(_ids(value, f"{where} pad_token_id"), f"{where} pad_token_id")
            pad_id = pads[0] if pads else None
    if pad_id is None:
        pad_id = eos_ids[0]

    template = None
    if chat_template:
        found = read_chat_template(root, tok_config)
        if found is None:
            raise UsageError(f"data.chat_template is true but model.path {str(directory)!r} has no chat template "
                             f"(no {CHAT_TEMPLATE_FILE}, no {CHAT_TEMPLATE_JSON_FILE} and no chat_template in "
                             f"{TOKENIZER_CONFIG_FILE}); set data.chat_template=false")
        template = ChatTemplate(found[0], strings, origin=found[1])
    return CheckpointText(tokenizer, bos_id, eos_ids, pad_id, template)


def copy_text_files(source: str | os.PathLike, target: str | os.PathLike) -> list[str]:
    """Copy the tokenizer and generation files of checkpoint ``source`` into ``target`` (a saved
    copy of its weights), so that the copy tokenizes, templates and stops as the source does.
    Returns the names copied. Each keeps its mode; a link or a file that is not a regular file is
    refused (``runtime.model.checkpoint_files``)."""
    return [name for name in TEXT_FILES if copy_file(source, name, target)]


__all__ = ["CheckpointText", "checkpoint_text", "copy_text_files", "load_tokenizer", "read_chat_template"]
