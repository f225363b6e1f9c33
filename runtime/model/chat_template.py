"""A checkpoint's chat template, rendered with Jinja in a sandbox.

The template comes from a user's ``tokenizer_config.json``: it is compiled by
``runtime.model.template_sandbox.BoundedEnvironment``, Jinja's ``ImmutableSandboxedEnvironment``
(no attribute access to Python internals, no mutation of the values it is given) with every
render's operations, characters and value sizes counted and bounded, configured as Transformers configures it (``trim_blocks``,
``lstrip_blocks``, the ``loopcontrols`` extension, a ``tojson`` filter that keeps non-ASCII text
and ``raise_exception``), so a prompt renders to the same text as ``apply_chat_template``.

Rendering is deterministic: the template sees only the messages, ``add_generation_prompt`` and the
tokenizer's special token strings. Transformers also offers ``strftime_now`` (today's date); it is
left undefined here, so templates that test ``strftime_now is defined`` take their fixed fallback
date, and a template that calls it unconditionally is refused when it first renders.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from runtime.model.template_sandbox import BoundedEnvironment, TemplateError, bounded_json

MAX_TEMPLATE_CHARS = 1 << 20  # templates of released checkpoints are a few KiB
MAX_RENDERED_CHARS = 1 << 22  # what one prompt may render to (4 MiB of text)
DEFAULT_NAME = "default"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def select_template(value: Any, *, source: str) -> str:
    """The template text of a ``chat_template`` entry: a string, or a list of
    ``{"name", "template"}`` objects from which the one named ``default`` is taken (as
    Transformers does when no tools are given)."""
    if isinstance(value, str):
        text = value
    elif isinstance(value, list):
        named = {}
        for entry in value:
            if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                    and isinstance(entry.get("template"), str)):
                raise TemplateError(f"{source}: chat_template list entries must be "
                                    f"{{\"name\": str, \"template\": str}}, got {_one_line(repr(entry))[:200]}")
            named[entry["name"]] = entry["template"]
        if DEFAULT_NAME not in named:
            raise TemplateError(f"{source}: chat_template lists templates {sorted(named)} but none named "
                                f"{DEFAULT_NAME!r}, the one used for prompts")
        text = named[DEFAULT_NAME]
    else:
        raise TemplateError(f"{source}: chat_template must be a string or a list of named templates, "
                            f"got {type(value).__name__}")
    if not text.strip():
        raise TemplateError(f"{source}: chat_template is empty")
    if len(text) > MAX_TEMPLATE_CHARS:
        raise TemplateError(f"{source}: chat_template has {len(text)} characters; at most {MAX_TEMPLATE_CHARS} "
                            "are accepted")
    return text


def _raise_exception(message: str) -> None:
    raise TemplateError(f"the chat template refused the prompt: {_one_line(message)}")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    # Transformers' filter: Jinja's own escapes HTML characters, which a chat prompt must keep.
    return bounded_json(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                        sort_keys=sort_keys)


@dataclasses.dataclass(frozen=True, eq=False)
class ChatTemplate:
    """A compiled chat template and the special token strings it may refer to.

    Attributes:
      source: the template text.
      special_tokens: ``bos_token``, ``eos_token``, ... as strings (absent ones left out).
      origin: the checkpoint file it was read from (``runtime.model.hf_text.TEMPLATE_FILES``), or
        empty.
      digest: sha256 (hex) of the template text, recorded in the run's config so that a replay
        knows it renders the same prompts.
    """

    source: str
    special_tokens: Mapping[str, str] = dataclasses.field(default_factory=dict)
    origin: str = ""

    def __post_init__(self) -> None:
        from jinja2 import TemplateSyntaxError
        from jinja2.ext import loopcontrols

        env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.add_filter("tojson", _tojson)
        env.globals["raise_exception"] = _raise_exception
        try:
            compiled = env.compile_template(self.source)
        except TemplateSyntaxError as e:
            raise TemplateError(f"chat template line {e.lineno}: {_one_line(e.message or str(e))}") from None
        except RecursionError:
            raise TemplateError("the chat template nests its expressions or blocks too deeply to compile") from None
        object.__setattr__(self, "_env", env)
        object.__setattr__(self, "_compiled", compiled)
        object.__setattr__(self, "special_tokens", dict(self.special_tokens))

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.source.encode("utf-8")).hexdigest()

    def render(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The prompt text of ``messages`` followed by the generation prompt (the opening of the
        assistant's turn), as ``apply_chat_template(..., add_generation_prompt=True,
        tokenize=False)`` renders it."""
        from jinja2 import TemplateError as JinjaError
        from jinja2.exceptions import SecurityError

        pieces, size = [], 0
        try:
            with self._env.rendering():  # type: ignore[attr-defined]
                for piece in self._compiled.generate(  # type: ignore[attr-defined]
                        messages=[dict(m) for m in messages], add_generation_prompt=True, **self.special_tokens):
                    size += len(piece)
                    if size > MAX_RENDERED_CHARS:
                        raise TemplateError(f"the chat template rendered more than {MAX_RENDERED_CHARS} characters "
                                            "for one prompt")
                    pieces.append(piece)
        except TemplateError:
            raise
        except SecurityError as e:
            raise TemplateError(f"the chat template tried an unsafe operation: {_one_line(str(e))}") from None
        except RecursionError:
            raise TemplateError("the chat template recursed too deeply while rendering") from None
        except (JinjaError, TypeError, ValueError, KeyError, IndexError, AttributeError, ArithmeticError) as e:
            raise TemplateError(f"the chat template failed to render: {type(e).__name__}: "
                                f"{_one_line(str(e))[:300]}") from None
        return "".join(pieces)


__all__ = ["ChatTemplate", "TemplateError", "select_template"]
