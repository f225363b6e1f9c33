"""Codecs and a sandbox shared by the episode tests."""

from __future__ import annotations

import json
import os
import pathlib
import string

import pytest

from runtime.model.chat_template import ChatTemplate
from runtime.model.tokenizer import DEFAULT_ALPHABET, EOS, char_tokenizer
from runtime.tasks.base import TextCodec
from verifiers.code import Sandbox
from verifiers.errors import SandboxUnavailable

SMOLLM2 = pathlib.Path("~/.cache/rlx/models/smollm2-135m-instruct").expanduser()
# SmolLM2-Instruct's template (ChatML): every message is <|im_start|>ROLE\nCONTENT<|im_end|>\n
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nyou are a helpful assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Each xdist worker searches for free uids from its own base (the verifier tests use 62_000 up).
_UID_BASE = 64_000 + 100 * int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)


def chatml_codec() -> TextCodec:
    """A character tokenizer (the built-in alphabet, capitals and the backtick of fenced code) with ChatML's two markers added and ``<|im_end|>`` as the
    stop id: a chat codec that needs no checkpoint."""
    tokenizer = char_tokenizer(DEFAULT_ALPHABET + string.ascii_uppercase + "`")
    tokenizer.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    end = tokenizer.token_to_id("<|im_end|>")
    template = ChatTemplate(CHATML, {"eos_token": EOS})
    return TextCodec(tokenizer, None, (end,), template=template)


@pytest.fixture(scope="session")
def chat_codec() -> TextCodec:
    return chatml_codec()


@pytest.fixture(scope="session")
def plain_codec() -> TextCodec:
    return TextCodec.builtin()


@pytest.fixture(scope="session")
def smollm2_codec() -> TextCodec:
    """SmolLM2-135M-Instruct's tokenizer and chat template, where the checkpoint was imported."""
    if not (SMOLLM2 / "config.json").is_file():
        pytest.skip(f"no SmolLM2 checkpoint at {SMOLLM2} (rlx models import smollm2-135m-instruct)")
    from runtime.model.hf_text import checkpoint_text

    config = json.loads((SMOLLM2 / "config.json").read_text())
    return TextCodec.for_checkpoint(checkpoint_text(SMOLLM2, config, chat_template=True))


@pytest.fixture(scope="session")
def sandbox():
    try:
        box = Sandbox("auto", slots=2, uid_base=_UID_BASE)
    except SandboxUnavailable as e:
        pytest.skip(f"no sandbox here: {e}")
    with box:
        yield box
