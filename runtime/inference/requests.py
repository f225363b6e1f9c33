"""What goes into the engine and what comes out: request checks, completions, run statistics."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from runtime.errors import UsageError
from runtime.inference.pages import pages_for
from runtime.inference.sampling import SamplingParams, seed_key_data


@dataclasses.dataclass(frozen=True, eq=False)
class Completion:
    """One generated sequence.

    Attributes:
      tokens: int32 ``[n]`` generated token ids (a stop token, if any, is the last one).
      logprobs: float32 ``[n]`` ``log softmax(logits / T)[token]`` of each generated token over the
        full vocabulary, before top-k / top-p truncation, with ``T = 1`` when greedy: the
        definition of ``kernels.logprobs.token_logprobs``, which the trainer recomputes.
      finish_reason: ``"stop"`` (a stop token or end-of-sequence id) or ``"length"`` (max_tokens).
      prompt_len: number of prompt tokens.
    """

    tokens: np.ndarray
    logprobs: np.ndarray
    finish_reason: str
    prompt_len: int


@dataclasses.dataclass(frozen=True)
class GenerateStats:
    """What the last ``generate`` did.

    Attributes:
      steps: decode steps run.
      prefills: prompts prefilled (one per admission, readmissions included, less the copies).
      preemptions: requests preempted by recompute.
      generated_tokens: tokens returned.
      replayed_tokens: tokens fed again after a preemption.
      allocated_tokens: sum over steps of the token capacity of the allocated pages.
      cached_tokens: sum over steps of the tokens actually cached after the step.
      admissions: ``(step, request, slot)`` of every admission, in order.
      decode_calls: device calls the decode steps took (host round trips).
      prefill_copies: admissions that got the prefill of an identical prompt admitted with them
        (sharing its full prompt pages).
      peak_pages: most KV pages in use at once (a page shared by several requests counts once).
    """

    steps: int
    prefills: int
    preemptions: int
    generated_tokens: int
    replayed_tokens: int
    allocated_tokens: int
    cached_tokens: int
    admissions: tuple[tuple[int, int, int], ...]
    decode_calls: int = 0
    prefill_copies: int = 0
    peak_pages: int = 0

    @property
    def kv_overhead(self) -> float:
        """Allocated KV bytes / bytes of the tokens cached, averaged over steps (1.0 = no waste)."""
        return self.allocated_tokens / self.cached_tokens if self.cached_tokens else 1.0


def check_requests(
    prompts: Sequence[Sequence[int] | np.ndarray],
    params: SamplingParams | Sequence[SamplingParams],
    seeds: Sequence[int],
    *,
    vocab_size: int,
    max_prompt_len: int,
    max_seq_len: int,
    page_size: int,
    num_pages: int,
) -> tuple[list[np.ndarray], list[SamplingParams], np.ndarray]:
    """Validate a batch of requests for an engine of these limits.

    Args:
      prompts, params, seeds: as ``Engine.generate`` takes them.
      vocab_size: the model's vocabulary; prompt and stop ids must be below it.
      max_prompt_len: the largest prefill bucket.
      max_seq_len: the most tokens (prompt + generated) a sequence may cache.
      page_size, num_pages: the page pool (usable pages), which one request must fit alone.

    Returns:
      ``(prompts, params, key_data)``: int32 prompts, one ``SamplingParams`` per request, and
      ``uint32[n, 2]`` key data of the seeds.

    Raises:
      UsageError: naming the first bad request and what would be accepted.
    """
    n = len(prompts)
    if isinstance(params, SamplingParams):
        params = [params] * n
    params = list(params)
    if len(params) != n or len(seeds) != n:
        raise UsageError(
            f"got {n} prompts, {len(params)} sampling params and {len(seeds)} seeds; give one "
            "SamplingParams (or one per prompt) and one seed per prompt"
        )
    V, biggest = vocab_size, max_prompt_len
    checked = []
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        if not isinstance(p, SamplingParams):
            raise UsageError(f"request {i}: sampling params {p!r} is not a SamplingParams")
        tokens = np.asarray(prompt)
        if tokens.ndim != 1 or tokens.size == 0 or not np.issubdtype(tokens.dtype, np.integer):
            raise UsageError(f"request {i}: a prompt is a non-empty list of token ids")
        if tokens.min() < 0 or tokens.max() >= V:
            raise UsageError(f"request {i}: prompt token ids must be in [0, {V})")
        bad_stops = [s for s in p.stop_token_ids if s >= V]
        if bad_stops:
            raise UsageError(f"request {i}: stop_token_ids {bad_stops} are not in [0, {V})")
        total = tokens.size + p.max_tokens
        if tokens.size > biggest:
            raise UsageError(
                f"request {i}: prompt of {tokens.size} tokens is longer than the largest "
                f"prefill bucket, {biggest}"
            )
        fits_pool = pages_for(total, page_size) <= num_pages
        if total > max_seq_len or not fits_pool:
            raise UsageError(
                f"request {i}: prompt of {tokens.size} tokens + max_tokens {p.max_tokens} = "
                f"{total} exceeds the engine's max_seq_len {max_seq_len} or its "
                f"{num_pages} pages of {page_size} tokens"
            )
        checked.append(tokens.astype(np.int32))
    key_data = np.stack([seed_key_data(s) for s in seeds]) if n else np.zeros((0, 2), np.uint32)
    return checked, params, key_data
