"""The inference engine: continuous batching over a paged KV cache, compiled once.

``Engine`` is the shell around three pure parts: the scheduler (``scheduler.plan`` /
``reserve`` / ``advance``: slots, queue, pages, preemption), the sampler (``sampling``) and the
device programs (``steps``). At construction it compiles, ahead of time, one decode program for
``max_slots`` slots (up to ``decode_steps`` steps per call) and one prefill per prompt bucket;
``generate`` then only ever calls those executables, so no shape can trigger a compilation (a new
shape would raise instead).

One decode call runs until the next scheduling event, at most ``decode_steps`` steps: while
requests wait for a slot, until the first running request reaches its ``max_tokens`` (so its slot
is refilled at once); otherwise until the last one does. A request that stops on a stop token
within a call keeps its slot to the end of that call (its extra tokens are dropped). Fewer host
round trips per token is most of what a small model's decode costs on a CPU.

A request's completion is a pure function of (weights, prompt, sampling params, seed): it does not
depend on the other requests, the slot it runs in, when it is admitted, or whether it is preempted
(``steps`` explains why). A preempted request is recomputed: its prompt is prefilled again at the
same bucket, and the tokens it had generated are fed back through the same decode step, which
rebuilds its cache bit for bit. The engine checks those bits as it replays.

A request may have several turns (an episode's, ``runtime.episodes``): when a turn ends, the
engine asks ``then`` whether the request goes on and receives the ids to feed after it (a tool
result, the chat template's markers) and the next turn's parameters and seed. The request keeps
its slot and its KV pages, drops what its slot decoded after the turn's last token, and feeds the
new ids through the same decode step, each overwriting a position the slot may have written past
the turn's end; then it samples. Everything after a request's prompt, sampled or fed, is thus
written by the decode step, so a request preempted between or within turns is rebuilt bit for bit
by the same recompute (prefill the prompt, feed the rest), and a request given the same ids as a
``feeds`` entry (feed them, then sample) gets the bits the continued one gets: keeping the pages
saves work and changes nothing. Pages are kept as long as the pool allows, that is, unless the
request is preempted.

Requests with the same prompt (a group of samples of one prompt) are prefilled once, and its full
pages are held once: a request admitted while one of its group that was prefilled is running
(admitted with it or before it) references that one's full prompt pages (``PagePool.share``) and
gets a copy of only its last, partially filled prompt page, the first page it writes its own
tokens into, and of its next-token logits as the prefill left them (``steps.copy_prompts``). Those are
the bits their own prefill would have written, at the cost of one page copy instead of a forward
pass over the prompt, and of one partial page instead of the prompt's pages per sample. Attention
reads a shared page as it reads any other, so a request's bits do not depend on whom it shares
pages with.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from kernels.paged_attention import IMPLS
from runtime.errors import RlxError, UsageError
from runtime.inference import scheduler
from runtime.inference.pages import PagePool, pages_for
from runtime.inference.requests import Completion, Continuation, GenerateStats, check_continuation, check_requests
from runtime.inference.sampling import SamplingParams, finish_reason
from runtime.inference.steps import copy_prompts, decode_steps, prefill_into_slots
from runtime.model import Model, init_cache

BATCHING = ("continuous", "static")
ADMISSIONS = ("arrival", "prompt_length")
MIN_BUCKET = 16
DEFAULT_PREFILL_TOKENS = 64
DEFAULT_DECODE_STEPS = 8


def _positive_int(name: str, value, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise UsageError(f"{name}={value!r} is not accepted; it must be an integer >= {least}")
    return int(value)


def default_buckets(max_prompt_len: int) -> tuple[int, ...]:
    """Powers of two from ``MIN_BUCKET`` (or less) up to the first that holds ``max_prompt_len``."""
    buckets = [min(MIN_BUCKET, 1 << (max_prompt_len - 1).bit_length())]
    while buckets[-1] < max_prompt_len:
        buckets.append(buckets[-1] * 2)
    return tuple(buckets)


def _shape_of(tree, *, sharded: bool = False):
    """The shapes and dtypes of ``tree`` (with each leaf's sharding when ``sharded``)."""
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding if sharded else None), tree
    )


def compute_params(params: dict, config) -> dict:
    """``params`` as the engine holds them: every weight in the compute dtype, cast once here.

    The layers cast each weight to the compute dtype where they use it, so the cast changes no
    value the trainer computes from float32 master weights; only RMSNorm scales stay as they are,
    because the norm multiplies in the wider of its scale's and its input's dtype.
    """
    dtype = config.compute_dtype

    def cast(path, x):
        if x.dtype == dtype or path[-1].key == "scale" or not jnp.issubdtype(x.dtype, jnp.floating):
            return x
        return x.astype(dtype)

    return jax.tree_util.tree_map_with_path(cast, params)


class Engine:
    """Generates completions with continuous batching (see the module docstring).

    Args:
      model: a ``runtime.model.Model`` (what ``load_hf`` returns).
      max_slots: sequences decoded together; every decode step runs all of them.
      page_size: tokens per KV cache page.
      num_pages: pages in the cache, including the reserved null page.
      max_seq_len: longest prompt + generation (sets the page-table width); default the smaller of
        the model's ``max_position_embeddings`` and what the pool holds.
      prefill_buckets: prompt lengths prefill is compiled for; default powers of two (16, 32, …)
        up to ``max_seq_len - 1``.
      prefill_tokens: prompt tokens per prefill call: a prompt of bucket ``T`` is prefilled with
        up to ``max(1, prefill_tokens // T)`` others (at most ``max_slots``) in one call of that
        fixed shape, whose unused rows are empty. More rows amortise a call when many requests
        arrive at once; fewer cost less when they trickle in one by one.
      attention_impl: paged attention implementation (``kernels.paged_attention.IMPLS``);
        ``"ordered"`` is the exact mode (``runtime.numerics``): prefill and decode compute every
        log-prob with the bits ``runtime.model.exact_forward`` gives the trainer, at some cost.
      mesh: a ``jax.sharding.Mesh`` whose ``model`` axis splits the weights (attention heads, MLP
        units, the LM head's vocabulary; ``runtime.trainer.mesh.param_spec``) and the KV cache's
        kv heads (when the axis divides them) over its devices, one SPMD program per call; None,
        one device. Rows never mix, so a request's bits still do not depend on its batch; they
        do depend on the mesh (the row-parallel sums split differently), which ``batch_shape``
        records.
      decode_steps: most decode steps per device call (see the module docstring). More save host
        round trips; fewer waste less of a slot whose request stops early on a stop token.
      share_prompts: requests with the same prompt are prefilled once while the prefilled one runs
        (the others share its pages); False prefills each into pages of its own (the same bits, for
        measuring what sharing saves).
      admission: the order in which queued requests take free slots: ``"arrival"``, the order
        of ``generate``'s prompts; ``"prompt_length"``, shortest prompt (with its feeds) first, a
        group's samples together, ties in arrival order (``admission_order``): the sequences
        decoded together then have similar lengths, and a decode step's attention runs to the
        longest of them. A pure function of the requests, and no completion depends on it.
    """

    def __init__(
        self,
        model: Model,
        *,
        max_slots: int,
        page_size: int,
        num_pages: int,
        max_seq_len: int | None = None,
        prefill_buckets: Sequence[int] | None = None,
        prefill_tokens: int = DEFAULT_PREFILL_TOKENS,
        attention_impl: str = "reference",
        decode_steps: int = DEFAULT_DECODE_STEPS,
        mesh=None,
        share_prompts: bool = True,
        admission: str = "arrival",
    ):
        self.config = model.config
        self.max_slots = _positive_int("max_slots", max_slots)
        self._empty_pool = PagePool.create(num_pages=num_pages, page_size=page_size)
        self.page_size, self.num_pages = page_size, num_pages
        holds = self._empty_pool.capacity * page_size
        if max_seq_len is None:
            max_seq_len = min(self.config.max_position_embeddings, holds)
        self.max_seq_len = _positive_int("max_seq_len", max_seq_len, least=2)
        if self.max_seq_len > self.config.max_position_embeddings:
            raise UsageError(
                f"max_seq_len={max_seq_len} is not accepted; the model's "
                f"max_position_embeddings is {self.config.max_position_embeddings}"
            )
        self.pages_per_seq = pages_for(self.max_seq_len, page_size)
        if prefill_buckets is None:
            prefill_buckets = default_buckets(self.max_seq_len - 1)
        self.buckets = tuple(sorted({_positive_int("prefill bucket", b) for b in prefill_buckets}))
        if not self.buckets:
            raise UsageError("prefill_buckets is empty; give at least one prompt length")
        self.prefill_tokens = _positive_int("prefill_tokens", prefill_tokens)
        self.prefill_rows = {
            T: max(1, min(self.max_slots, self.prefill_tokens // T)) for T in self.buckets
        }
        if attention_impl not in IMPLS:
            raise UsageError(
                f"attention_impl={attention_impl!r} is not accepted; accepted: {', '.join(IMPLS)}"
            )
        self.attention_impl = attention_impl
        self.decode_steps = _positive_int("decode_steps", decode_steps)
        self.mesh = mesh
        self.share_prompts = share_prompts
        if admission not in ADMISSIONS:
            raise UsageError(f"admission={admission!r} is not accepted; accepted: {', '.join(ADMISSIONS)}")
        self.admission = admission
        self._given_shape = _shape_of(model.params)
        self._params = self._place(compute_params(model.params, self.config))
        self._params_shape = _shape_of(self._params, sharded=mesh is not None)
        self._compile()
        self._reset_buffers()
        self.last_stats: GenerateStats | None = None

    @property
    def batch_shape(self) -> dict:
        """The settings a completion's bits depend on, besides weights, request and software.

        XLA's arithmetic depends on array shapes, so the same request gives the same bits on
        engines with equal ``batch_shape`` (and the same model config and software stack), and
        possibly other bits otherwise. ``num_pages`` is not part of it: which physical pages hold
        a sequence never changes its results. Record it next to rollouts that must be replayed.
        """
        return {
            "max_slots": self.max_slots,
            "page_size": self.page_size,
            "max_seq_len": self.max_seq_len,
            "prefill_buckets": list(self.buckets),
            "prefill_tokens": self.prefill_tokens,
            "attention_impl": self.attention_impl,
            "decode_steps": self.decode_steps,
            **({"mesh": {"model": self.mesh.shape["model"]}} if self.mesh is not None else {}),
        }

    # -- placement on the mesh --------------------------------------------------------------

    def _place(self, params: dict) -> dict:
        if self.mesh is None:
            return jax.device_put(params)
        from runtime.trainer.mesh import shard_tree

        return shard_tree(self.mesh, params)

    def _sharding(self, spec=None):
        """A ``NamedSharding`` of the engine's mesh (replicated by default); None without one."""
        if self.mesh is None:
            return None
        from jax.sharding import NamedSharding, PartitionSpec

        return NamedSharding(self.mesh, spec if spec is not None else PartitionSpec())

    def _cache_sharding(self):
        """The KV pages split by kv head over ``model`` when it divides them, else replicated."""
        from jax.sharding import PartitionSpec

        model = self.mesh.shape["model"] if self.mesh is not None else 1
        return self._sharding(PartitionSpec("model") if self.config.num_kv_heads % model == 0 else None)

    # -- device programs -------------------------------------------------------------------

    def _compile(self) -> None:
        c, S, P, N = self.config, self.max_slots, self.pages_per_seq, self.decode_steps
        cache = _shape_of(
            jax.eval_shape(
                functools.partial(
                    init_cache, c, num_pages=self.num_pages, page_size=self.page_size
                )
            )
        )
        whole = self._sharding()  # every other array replicated over the mesh (None: one device)
        cache_sharding = self._cache_sharding()
        if cache_sharding is not None:
            cache = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=cache_sharding), cache)
        logits = jax.ShapeDtypeStruct((S, c.vocab_size), jnp.float32, sharding=whole)

        def i32(*shape):
            return jax.ShapeDtypeStruct(shape, jnp.int32, sharding=whole)

        def f32(*shape):
            return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=whole)

        decode = functools.partial(decode_steps, config=c, attention_impl=self.attention_impl)
        # The exact mode's decode attention; its prefill then computes with the same order and rows.
        exact_block = self.page_size if self.attention_impl == "ordered" else 0
        fill = functools.partial(prefill_into_slots, config=c, exact_block=exact_block)
        if whole is None:
            step = jax.jit(decode, donate_argnums=(1, 2))
            prefill = jax.jit(fill, donate_argnums=(5, 6, 7))
            copy = jax.jit(copy_prompts, donate_argnums=(0, 1))
        else:  # the outputs keep the inputs' layouts: each call's results are the next one's inputs
            kept = jax.tree.map(lambda x: x.sharding, cache)
            step = jax.jit(decode, donate_argnums=(1, 2), out_shardings=(kept, whole, whole, whole))
            prefill = jax.jit(fill, donate_argnums=(5, 6, 7), out_shardings=(kept, whole, whole))
            copy = jax.jit(copy_prompts, donate_argnums=(0, 1), out_shardings=(kept, whole))
        self._step = step.lower(
            self._params_shape, cache, logits, i32(S, P), i32(S), i32(S), i32(S, N),
            jax.ShapeDtypeStruct((S, 2), jnp.uint32, sharding=whole), i32(S),
            f32(S), i32(S), f32(S), i32(),
        ).compile()
        self._prefill = {
            T: prefill.lower(
                self._params_shape, i32(R, T), i32(R), i32(R, P), i32(R), cache, logits, logits
            ).compile()
            for T, R in self.prefill_rows.items()
        }
        self._copy = copy.lower(cache, logits, logits, i32(S), i32(S), i32(S), i32(S)).compile()

    def _reset_buffers(self) -> None:
        self._cache = init_cache(self.config, num_pages=self.num_pages, page_size=self.page_size)
        self._logits = jnp.zeros((self.max_slots, self.config.vocab_size), jnp.float32)
        self._firsts = jnp.zeros((self.max_slots, self.config.vocab_size), jnp.float32)  # the prompt logits
        if self.mesh is not None:
            self._cache = jax.device_put(self._cache, self._cache_sharding())
            self._logits = jax.device_put(self._logits, self._sharding())
            self._firsts = jax.device_put(self._firsts, self._sharding())

    def update_params(self, params: dict) -> None:
        """Generate with other weights of the same shapes and dtypes (no recompilation)."""
        if _shape_of(params) != self._given_shape:
            raise UsageError(
                "the new parameters do not match the engine's model: the tree structure, shapes "
                "and dtypes must be those the engine was built with"
            )
        self._params = self._place(compute_params(params, self.config))

    # -- requests --------------------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[Sequence[int] | np.ndarray],
        params: SamplingParams | Sequence[SamplingParams],
        seeds: Sequence[int],
        *,
        batching: str = "continuous",
        feeds: Sequence[Sequence[int] | np.ndarray] | None = None,
        then: Callable[[int, Completion], Continuation | None] | None = None,
    ) -> list[Completion]:
        """Complete every prompt; ``completions[i]`` belongs to ``prompts[i]``.

        Args:
          prompts: token ids of each prompt.
          params: one ``SamplingParams`` for all, or one per prompt.
          seeds: one seed in ``[0, 2**64)`` per prompt (``sampling`` says how keys derive from it).
          batching: ``"continuous"`` (a request enters as soon as a slot and pages are free) or
            ``"static"`` (a new batch starts only when the whole previous batch has finished).
            The completions are the same either way; only the time differs.
          feeds: per prompt, ids that follow it and are fed through the decoder, not sampled,
            before sampling starts (an episode's ids after its first prompt); None, none.
          then: called with ``(request, completion)`` whenever one of a request's turns ends;
            a ``Continuation`` makes the request go on in its slot, on its pages (see the module
            docstring), None ends it. Without it every request has one turn.

        Returns:
          Each request's last turn.

        Raises:
          UsageError: a prompt, seed, feed, parameter or continuation is not accepted (the
            message names it).
        """
        if batching not in BATCHING:
            raise UsageError(
                f"batching={batching!r} is not accepted; accepted: {', '.join(BATCHING)}"
            )
        prompts, params, key_data, feeds = check_requests(
            prompts, params, seeds, vocab_size=self.config.vocab_size,
            max_prompt_len=self.buckets[-1], max_seq_len=self.max_seq_len,
            page_size=self.page_size, num_pages=self._empty_pool.capacity, feeds=feeds,
        )
        try:
            return self._run_in_order(prompts, params, key_data, feeds, then, static=batching == "static")
        except BaseException:
            self._reset_buffers()  # donated buffers may be gone mid-step
            raise

    def _run_in_order(self, prompts, params, key_data, feeds, then, *, static: bool) -> list[Completion]:
        """``_run`` over the requests in ``admission_order`` (the scheduler admits by request id),
        with the results, the callbacks' and the messages' request numbers and the admissions in
        the caller's numbering."""
        order = admission_order(prompts, feeds, self.admission)
        if order == list(range(len(prompts))):
            return self._run(prompts, params, key_data, feeds, then, static=static, names=order)
        done = self._run([prompts[i] for i in order], [params[i] for i in order], key_data[order],
                         [feeds[i] for i in order], then, static=static, names=order)
        stats = self.last_stats
        assert stats is not None  # _run sets it
        self.last_stats = dataclasses.replace(
            stats, admissions=tuple((step, order[r], slot) for step, r, slot in stats.admissions))
        out: list[Completion] = [None] * len(order)  # type: ignore[list-item]
        for position, request in enumerate(order):
            out[request] = done[position]
        return out

    def _run(self, prompts, params, key_data, feeds, then, *, static: bool, names: list[int]) -> list[Completion]:
        n = len(prompts)
        lengths = [p.size for p in prompts]
        params, key_data = list(params), key_data.copy()
        # Each request's ids after its prompt, fed or sampled, and the log-prob of each sampled
        # one (None where fed): what a readmitted request feeds again.
        history: list[list[int]] = [f.tolist() for f in feeds]
        logprobs: list[list[np.float32 | None]] = [[None] * f.size for f in feeds]
        starts = [f.size for f in feeds]  # where the current turn's ids start in the history
        # Per request, each turn's temperature and where each ended turn's sampled ids end in the
        # history: a token sampled in an earlier turn and fed again after a preemption gets its
        # log-prob at its own turn's temperature, to be checked (``_turn_of``).
        temperatures: list[list[float]] = [[p.temperature] for p in params]
        turn_ends: list[list[int]] = [[] for _ in range(n)]
        stops = [p.stop_ids(self.config.eos_token_ids) for p in params]
        last: list[Completion | None] = [None] * n
        groups = _first_of([p.tobytes() for p in prompts]) if self.share_prompts else None
        state = scheduler.Schedule.start(n, max_slots=self.max_slots, pool=self._empty_pool)
        steps = calls = prefills = copies = preemptions = replayed = fed = allocated = cached = peak = 0
        turns = 0
        refeed: dict[int, int] = {}  # request -> the sampled token it feeds again after a turn
        admissions = []
        while not state.done:
            state, decisions = scheduler.plan(state, lengths, static=static, groups=groups)
            preemptions += len(decisions.preempted)
            self._prefill_requests(state, decisions, prompts)
            for request, slot in decisions.admitted:
                admissions.append((steps, request, slot))
            prefills += len(decisions.admitted) - len(decisions.shared)
            copies += len(decisions.shared)
            # A call feeds again the sampled ids of one turn at most, at that turn's temperature
            # (a token fed again unchecked after its turn belongs to the next one).
            bounds, temps = {}, {}
            for r in state.running:
                t = state.cached[r] - lengths[r]
                turn, end = _turn_of(turn_ends[r], t + (refeed.get(r) == t))
                temps[r] = temperatures[r][turn]
                if end is not None:
                    bounds[r] = lengths[r] + end
            # The tokens a request has cached once it drew its turn's last token (a step feeds the
            # token it draws): a decode call never takes a request past it.
            ends = {r: lengths[r] + starts[r] + params[r].max_tokens for r in state.running}
            state, takes = self._reserve(state, ends, bounds, static=static)
            peak = max(peak, state.pool.num_used)
            num_steps = max(takes.values())
            inputs = self._step_inputs(state, takes, lengths, history, starts, temps, key_data, params)
            self._cache, self._logits, out_tokens, out_logprobs = self._step(
                self._params, self._cache, self._logits, *inputs, np.int32(num_steps)
            )
            out_tokens, out_logprobs = np.asarray(out_tokens), np.asarray(out_logprobs)
            finished, rewound = [], {}
            for slot, request in enumerate(state.slots):
                if request is None:
                    continue
                for i in range(takes[request]):
                    t = state.cached[request] + i - lengths[request]
                    if t < len(history[request]):
                        first = logprobs[request][t]
                        if first is None:
                            fed += 1
                        elif refeed.get(request) == t:  # its slot's logits were not its own
                            del refeed[request]
                        elif out_logprobs[i, slot].tobytes() != first.tobytes():
                            raise RlxError(
                                f"request {names[request]}: token {t} replayed after a preemption with "
                                f"log-prob {out_logprobs[i, slot]!r}, first computed as "
                                f"{first!r}; the engine is not batch-invariant here"
                            )
                        else:
                            replayed += 1
                        continue
                    token = int(out_tokens[i, slot])
                    history[request].append(token)
                    logprobs[request].append(out_logprobs[i, slot])
                    start = starts[request]
                    reason = finish_reason(
                        token, t + 1 - start, params[request].max_tokens, stops[request]
                    )
                    if reason is None:
                        continue
                    turns += 1
                    ended = Completion(
                        _frozen(np.array(history[request][start:], np.int32)),
                        _frozen(np.array(logprobs[request][start:], np.float32)),
                        reason,
                        lengths[request] + start,
                    )
                    more = then(names[request], ended) if then is not None else None
                    if more is None:
                        last[request] = ended
                        finished.append(request)
                        break
                    ids, params[request], key_data[request] = check_continuation(
                        names[request], lengths[request] + t + 1, more, vocab_size=self.config.vocab_size,
                        max_seq_len=self.max_seq_len, page_size=self.page_size,
                        num_pages=self._empty_pool.capacity,
                    )
                    p = params[request]
                    stops[request] = p.stop_ids(self.config.eos_token_ids)
                    history[request] += ids.tolist()
                    logprobs[request] += [None] * ids.size
                    turn_ends[request].append(t + 1)
                    temperatures[request].append(p.temperature)
                    starts[request] = len(history[request])
                    # What the slot decoded after this token is dropped. With nothing to feed,
                    # the token is fed again for its next-token logits (the same bits).
                    rewound[request] = lengths[request] + t + (1 if ids.size else 0)
                    if not ids.size:
                        refeed[request] = t
                    break
            steps += num_steps
            calls += 1
            allocated += num_steps * state.pool.num_used * self.page_size
            cached += sum(
                state.cached[r] + min(i + 1, takes[r]) for r in state.running
                for i in range(num_steps)
            )
            state = scheduler.advance(state, finished, takes)
            for request, upto in sorted(rewound.items()):
                state = scheduler.rewind(state, request, upto)
        self.last_stats = GenerateStats(
            steps, prefills, preemptions, sum(lp is not None for lps in logprobs for lp in lps), replayed,
            allocated, cached, tuple(admissions), calls, copies, peak, fed, turns,
        )
        done = [c for c in last if c is not None]
        assert len(done) == n  # the loop runs until every request has finished
        assert state.pool.num_used == 0 and not state.pool.refs, state.pool  # no page leaked
        return done

    def _reserve(self, state, ends, bounds, *, static: bool):
        """Steps for the next decode call and pages for them: ``(state, tokens per request)``.

        The call runs to the next scheduling event (see the module docstring), at most
        ``decode_steps`` steps, and fewer when the free pages do not cover them (``plan``
        reserved one step, so one always fits). A request that feeds again the turns it had
        before a preemption stops at each turn's end (``bounds``): a call runs one temperature
        per slot.
        """
        left = {r: ends[r] - state.cached[r] for r in state.running}
        until = min if state.waiting and not static else max
        # a slot that takes fewer steps than the call loses its logits, so a bound bounds the call
        want = min(self.decode_steps, until(left.values()), *(b - state.cached[r] for r, b in bounds.items()))
        while True:
            takes = {r: min(want, n) for r, n in left.items()}
            reserved = scheduler.reserve(state, takes) if want > 1 else state
            if reserved is not None:
                return reserved, takes
            want //= 2

    def _prefill_requests(self, state, decisions, prompts) -> None:
        """Prefill the admitted requests, grouped by bucket, ``prefill_rows[bucket]`` per call; a
        request that shares a running one's prompt pages gets a copy of that one's partially
        filled prompt page (if the prompt has one) and prompt logits."""
        P, S = self.pages_per_seq, self.max_slots
        by_bucket: dict[int, list[tuple[int, int]]] = {}
        sources = dict(decisions.shared)
        copies: list[tuple[int, int, int, int]] = []  # (request, slot, source request, source slot)
        for request, slot in decisions.admitted:
            prompt = prompts[request]
            if request in sources:
                copies.append((request, slot, sources[request], state.slot_of(sources[request])))
                continue
            bucket = next(b for b in self.buckets if b >= prompt.size)
            by_bucket.setdefault(bucket, []).append((request, slot))
        for bucket, group in sorted(by_bucket.items()):
            R = self.prefill_rows[bucket]
            for lo in range(0, len(group), R):
                tokens = np.zeros((R, bucket), np.int32)
                lengths = np.zeros(R, np.int32)
                rows = np.zeros((R, P), np.int32)
                slots = np.full(R, S, np.int32)
                for i, (request, slot) in enumerate(group[lo : lo + R]):
                    prompt = prompts[request]
                    tokens[i, : prompt.size], lengths[i] = prompt, prompt.size
                    rows[i], slots[i] = state.pool.table_row(request, P), slot
                self._cache, self._logits, self._firsts = self._prefill[bucket](
                    self._params, tokens, lengths, rows, slots, self._cache, self._logits, self._firsts
                )
        for lo in range(0, len(copies), S):
            from_pages = np.zeros(S, np.int32)  # the null page onto itself where unused
            to_pages = np.zeros(S, np.int32)
            from_slots = np.full(S, S, np.int32)
            to_slots = np.full(S, S, np.int32)
            for i, (request, slot, source, source_slot) in enumerate(copies[lo : lo + S]):
                size = prompts[request].size
                if size % self.page_size:  # the partial page: the first one the two write apart
                    last = size // self.page_size
                    from_pages[i] = state.pool.owned(source)[last]
                    to_pages[i] = state.pool.owned(request)[last]
                from_slots[i], to_slots[i] = source_slot, slot
            self._cache, self._logits = self._copy(
                self._cache, self._logits, self._firsts, from_pages, to_pages, from_slots, to_slots
            )

    def _step_inputs(self, state, takes, lengths, history, starts, temps, key_data, params):
        S, P, N = self.max_slots, self.pages_per_seq, self.decode_steps
        table = np.zeros((S, P), np.int32)
        positions = np.full(S, -1, np.int32)
        take = np.zeros(S, np.int32)
        forced = np.full((S, N), -1, np.int32)
        keys = np.zeros((S, 2), np.uint32)
        index = np.zeros(S, np.int32)
        temp, k, p = np.zeros(S, np.float32), np.zeros(S, np.int32), np.ones(S, np.float32)
        for slot, request in enumerate(state.slots):
            if request is None:
                continue
            table[slot] = state.pool.table_row(request, P)
            positions[slot] = state.cached[request]
            take[slot] = takes[request]
            t = state.cached[request] - lengths[request]
            index[slot] = t - starts[request]  # negative while it feeds (nothing is drawn then)
            replay = history[request][t : t + N]
            forced[slot, : len(replay)] = replay
            keys[slot] = key_data[request]
            temp[slot], k[slot], p[slot] = temps[request], params[request].top_k, params[request].top_p
        return table, positions, take, forced, keys, index, temp, k, p


def admission_order(prompts: Sequence[np.ndarray], feeds: Sequence[np.ndarray], admission: str) -> list[int]:
    """The requests in the order they are admitted: as given (``"arrival"``), or by the tokens each
    caches before it samples, prompt and feeds, shortest first, the samples of one prompt (with
    the same feeds) together, ties in arrival order (``"prompt_length"``)."""
    if admission == "arrival":
        return list(range(len(prompts)))
    first = _first_of([(p.tobytes(), f.tobytes()) for p, f in zip(prompts, feeds, strict=True)])
    return sorted(range(len(prompts)), key=lambda i: (prompts[i].size + feeds[i].size, first[i], i))


def _first_of(keys: Sequence) -> list[int]:
    """For each key, the position of its first occurrence: equal keys, one group, named by it."""
    firsts: dict = {}
    return [firsts.setdefault(key, i) for i, key in enumerate(keys)]


def _turn_of(turn_ends: Sequence[int], t: int) -> tuple[int, int | None]:
    """The turn whose sampled ids come next from history position ``t`` on (ids fed before a
    turn belong to it), and where that turn's sampled ids end if it has ended (else None)."""
    turn = sum(end <= t for end in turn_ends)
    return turn, (turn_ends[turn] if turn < len(turn_ends) else None)


def _frozen(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array
