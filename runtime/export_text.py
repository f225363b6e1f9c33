"""An exported checkpoint's tokenizer starts a prompt as rlx does.

rlx starts a plain prompt with the BOS id of its codec (``runtime.tasks.base.TextCodec``): the
built-in model always, a checkpoint where its text files say so (``runtime.model.hf_text``:
``add_bos_token``, else the architecture). Transformers' tokenizer adds whatever the
post-processor of ``tokenizer.json`` adds. Where the two differ, the export rewrites the
post-processor (a BOS template after any processor already there, or the template's leading
BOS removed) and states ``add_bos_token`` in ``tokenizer_config.json``, so that
``AutoTokenizer(prompt)`` gives the ids rlx prompted the model with. Where they agree the files
are left as they are (a checkpoint's copies stay byte for byte).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tokenizers import Tokenizer, processors

from runtime.errors import UsageError

_PROBE = "1"  # any text: what matters is what the post-processor puts before it


def added_prefix(tokenizer: Tokenizer) -> list[int]:
    """The ids ``tokenizer`` puts before a text when it adds its special tokens."""
    plain = tokenizer.encode(_PROBE, add_special_tokens=False).ids
    full = tokenizer.encode(_PROBE, add_special_tokens=True).ids
    return full[: len(full) - len(plain)] if full[len(full) - len(plain):] == plain else full


def _with_bos(tokenizer: Tokenizer, bos_id: int) -> Tokenizer:
    token = tokenizer.id_to_token(bos_id)
    if token is None:
        raise UsageError(f"the BOS id {bos_id} is not in the tokenizer's vocabulary; cannot export a tokenizer that "
                         "adds it")
    out = Tokenizer.from_str(tokenizer.to_str())
    template = processors.TemplateProcessing(single=f"{token} $A", pair=f"{token} $A {token} $B",
                                             special_tokens=[(token, bos_id)])
    existing = out.post_processor
    out.post_processor = template if existing is None else processors.Sequence([existing, template])
    return out


def _without_bos(tokenizer: Tokenizer) -> Tokenizer:
    """The tokenizer with the leading special token of its template(s) removed."""
    spec = json.loads(tokenizer.to_str())

    def strip(processor: dict[str, Any]) -> dict[str, Any]:
        if processor.get("type") == "Sequence":
            return {**processor, "processors": [strip(p) for p in processor["processors"]]}
        if processor.get("type") != "TemplateProcessing":
            return processor
        return {**processor, **{side: processor[side][1:] for side in ("single", "pair")
                                if processor[side] and "SpecialToken" in processor[side][0]}}

    spec["post_processor"] = strip(spec["post_processor"])
    out = Tokenizer.from_str(json.dumps(spec))
    if added_prefix(out):
        raise UsageError("the checkpoint's tokenizer.json adds tokens before a prompt that rlx does not add, in a "
                         "post-processor the export cannot rewrite; remove them from tokenizer.json")
    return out


def aligned_text_files(tokenizer: Tokenizer, tok_config: Mapping[str, Any], bos_id: int | None) -> dict[str, str]:
    """``{file name: text}`` of ``tokenizer.json`` and ``tokenizer_config.json`` rewritten so that
    the tokenizer adds ``bos_id`` (None: nothing) before a prompt, as rlx does; ``{}`` when it
    already does and ``tok_config`` does not say otherwise."""
    want = [] if bos_id is None else [bos_id]
    has = added_prefix(tokenizer)
    if has == want and tok_config.get("add_bos_token", bool(want)) == bool(want):
        return {}
    fixed = tokenizer
    if has != want:
        fixed = _without_bos(fixed) if has else fixed
        fixed = fixed if bos_id is None else _with_bos(fixed, bos_id)
    files = {"tokenizer_config.json": json.dumps({**tok_config, "add_bos_token": bos_id is not None}, indent=2,
                                                 ensure_ascii=False) + "\n"}
    if fixed is not tokenizer:
        files["tokenizer.json"] = fixed.to_str()
    return files


__all__ = ["added_prefix", "aligned_text_files"]
