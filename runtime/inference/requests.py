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


@dataclasses.dataclass(frozen=True, eq=False)
class Continuation:
    """How a request goes on after one of its turns ends (what ``Engine.generate``'s ``then``
    returns): ``ids`` are fed after the turn's tokens (cached, never sampled), then the next turn
    is sampled with ``params`` (its ``max_tokens`` bounds that turn) and ``seed``.

    Attributes:
      ids: token ids to feed (a tool result and the chat template's markers around it); may be
        empty.
      params: the next turn's ``SamplingParams``.
      seed: the next turn's seed in ``[0, 2**64)``.
    """

    ids: Sequence[int] | np.ndarray
    params: SamplingParams
    seed: int


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
      prefill_copies: admissions that got the prefill of an identical prompt's running request
        (sharing its full prompt pages).
      peak_pages: most KV pages in use at once (a page shared by several requests counts once).
      fed_tokens: ids fed through the decoder without being sampled (``feeds`` and continuations'
        ``ids``, again after a preemption).
      turns: turns that ended (one per request, more with continuations).
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
    fed_tokens: int = 0
    turns: int = 0

    @property
    def kv_overhead(self) -> float:
        """Allocated KV bytes / bytes of the tokens cached, averaged over steps (1.0 = no waste)."""
        return self.allocated_tokens / self.cached_tokens if self.cached_tokens else 1.0


def _ids(values, what: str, vocab_size: int, *, empty: bool) -> np.ndarray:
    tokens = np.asarray(values)
    if tokens.size == 0 and empty:
        return np.zeros(0, np.int32)
    if tokens.ndim != 1 or tokens.size == 0 or not np.issubdtype(tokens.dtype, np.integer):
        raise UsageError(f"{what} is a {'' if empty else 'non-empty '}list of token ids")
    if tokens.min() < 0 or tokens.max() >= vocab_size:
        raise UsageError(f"{what}'s token ids must be in [0, {vocab_size})")
    return tokens.astype(np.int32)


def _params(p, what: str, vocab_size: int) -> SamplingParams:
    """``p`` when it is a ``SamplingParams`` whose stop ids are in the vocabulary."""
    if not isinstance(p, SamplingParams):
        raise UsageError(f"{what}: sampling params {p!r} is not a SamplingParams")
    bad_stops = [s for s in p.stop_token_ids if s >= vocab_size]
    if bad_stops:
        raise UsageError(f"{what}: stop_token_ids {bad_stops} are not in [0, {vocab_size})")
    return p


def _fits(what: str, cached: int, p: SamplingParams, *, max_seq_len: int, page_size: int, num_pages: int) -> None:
    """``cached`` ids and ``p.max_tokens`` more fit one sequence of the engine, alone in its pool."""
    total = cached + p.max_tokens
    if total > max_seq_len or pages_for(total, page_size) > num_pages:
        raise UsageError(
            f"{what} of {cached} tokens + max_tokens {p.max_tokens} = {total} exceeds the engine's "
            f"max_seq_len {max_seq_len} or its {num_pages} pages of {page_size} tokens"
        )


def check_continuation(
    request: int, cached: int, more: Continuation, *, vocab_size: int, max_seq_len: int, page_size: int,
    num_pages: int,
) -> tuple[np.ndarray, SamplingParams, np.ndarray]:
    """Validate ``more``, the continuation of request ``request`` whose sequence holds ``cached``
    ids: ``(ids, params, key_data)``. Raises ``UsageError`` naming what is not accepted."""
    what = f"request {request}'s continuation"
    if not isinstance(more, Continuation):
        raise UsageError(f"{what} {more!r} is not a Continuation (or None, to end the request)")
    params = _params(more.params, what, vocab_size)
    ids = _ids(more.ids, what, vocab_size, empty=True)
    _fits(f"{what}: the sequence", cached + ids.size, params, max_seq_len=max_seq_len, page_size=page_size,
          num_pages=num_pages)
    return ids, params, seed_key_data(more.seed)


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
    feeds: Sequence[Sequence[int] | np.ndarray] | None = None,
) -> tuple[list[np.ndarray], list[SamplingParams], np.ndarray, list[np.ndarray]]:
    """Validate a batch of requests for an engine of these limits.

    Args:
      prompts, params, seeds, feeds: as ``Engine.generate`` takes them.
      vocab_size: the model's vocabulary; prompt and stop ids must be below it.
      max_prompt_len: the largest prefill bucket.
      max_seq_len: the most tokens (prompt + generated) a sequence may cache.
      page_size, num_pages: the page pool (usable pages), which one request must fit alone.

    Returns:
      ``(prompts, params, key_data, feeds)``: int32 prompts, one ``SamplingParams`` per request,
      ``uint32[n, 2]`` key data of the seeds, and int32 feeds (empty where none).

    Raises:
      UsageError: naming the first bad request and what would be accepted.
    """
    n = len(prompts)
    if isinstance(params, SamplingParams):
        params = [params] * n
    params = list(params)
    if feeds is None:
        feeds = [()] * n
    if len(params) != n or len(seeds) != n or len(feeds) != n:
        raise UsageError(
            f"got {n} prompts, {len(params)} sampling params, {len(seeds)} seeds and {len(feeds)} "
            "feeds; give one SamplingParams (or one per prompt), one seed per prompt and, if any, "
            "one feed per prompt"
        )
    checked, fed = [], []
    for i, (prompt, p, feed) in enumerate(zip(prompts, params, feeds, strict=True)):
        p = _params(p, f"request {i}", vocab_size)
        tokens = _ids(prompt, f"request {i}: a prompt", vocab_size, empty=False)
        feed = _ids(feed, f"request {i}: a feed", vocab_size, empty=True)
        if tokens.size > max_prompt_len:
            raise UsageError(
                f"request {i}: prompt of {tokens.size} tokens is longer than the largest "
                f"prefill bucket, {max_prompt_len}"
            )
        _fits(f"request {i}: prompt" + (" and feed" if feed.size else ""), tokens.size + feed.size, p, max_seq_len=max_seq_len, page_size=page_size,
              num_pages=num_pages)
        checked.append(tokens)
        fed.append(feed)
    key_data = np.stack([seed_key_data(s) for s in seeds]) if n else np.zeros((0, 2), np.uint32)
    return checked, params, key_data, fed
