"""The engine: batch invariance, agreement with the training forward, no recompilation."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.logprobs import token_logprobs
from runtime.errors import UsageError
from runtime.inference import Engine, SamplingParams
from runtime.model import forward
from tests.runtime.inference.conftest import CONFIG, ENGINE, EOS, widened_model

MAX_SEQ = ENGINE["max_seq_len"]
# float32 on CPU: the paged decode path and the full forward differ only in summation order.
LOGPROB_TOL = 1e-5


def _workload(n: int, seed: int):
    """Mixed prompt lengths, output lengths and sampling settings."""
    gen = np.random.default_rng(seed)
    prompts, params = [], []
    for i in range(n):
        length = int(gen.integers(1, 21))
        prompts.append(gen.integers(3, CONFIG.vocab_size, length).tolist())
        params.append(
            SamplingParams(
                temperature=float(gen.choice([0.0, 0.7, 1.0, 1.3])),
                top_k=int(gen.choice([0, 0, 5])),
                top_p=float(gen.choice([1.0, 1.0, 0.9])),
                max_tokens=int(gen.integers(1, MAX_SEQ - length + 1)),
                stop_token_ids=(7,) if i % 3 == 0 else (),
                ignore_eos=i % 4 == 1,
            )
        )
    seeds = [int(s) for s in gen.integers(0, 2**63, n)]
    return prompts, params, seeds


WORKLOAD = _workload(12, seed=0)


@pytest.fixture(scope="module")
def alone(engine):
    """Each request of WORKLOAD generated on its own."""
    prompts, params, seeds = WORKLOAD
    requests = zip(prompts, params, seeds, strict=True)
    return [engine.generate([p], [q], [s])[0] for p, q, s in requests]


def _assert_same(got, expected, label):
    assert got.prompt_len == expected.prompt_len, label
    np.testing.assert_array_equal(got.tokens, expected.tokens, err_msg=label)
    assert got.logprobs.tobytes() == expected.logprobs.tobytes(), f"{label}: log-prob bits differ"
    assert got.finish_reason == expected.finish_reason, label


@pytest.mark.slow
def test_completions_are_well_formed(alone):
    prompts, params, _ = WORKLOAD
    reasons = set()
    for c, prompt, p in zip(alone, prompts, params, strict=True):
        assert c.prompt_len == len(prompt) and 1 <= c.tokens.size <= p.max_tokens
        assert c.tokens.dtype == np.int32 and c.logprobs.dtype == np.float32
        assert c.logprobs.shape == c.tokens.shape and (c.logprobs <= 0).all()
        stops = p.stop_ids((EOS,))
        assert not set(c.tokens[:-1].tolist()) & stops  # nothing generated past a stop token
        if c.finish_reason == "stop":
            assert int(c.tokens[-1]) in stops
        else:
            assert c.finish_reason == "length" and c.tokens.size == p.max_tokens
        reasons.add(c.finish_reason)
    assert reasons == {"stop", "length"}


def test_a_request_is_the_same_alone_in_a_full_batch_in_any_order_and_after_preemption(
    engine, alone
):
    prompts, params, seeds = WORKLOAD
    slots_seen = {i: set() for i in range(len(prompts))}
    late = preempted = replayed = calls = steps = 0
    shuffled = [5, 0, 11, 3, 8, 1, 10, 2, 7, 4, 9, 6]
    for order in (list(range(12)), list(reversed(range(12))), shuffled):
        for batching in ("continuous", "static"):
            out = engine.generate(
                [prompts[i] for i in order], [params[i] for i in order], [seeds[i] for i in order],
                batching=batching,
            )
            for position, i in enumerate(order):
                _assert_same(out[position], alone[i], f"request {i} at {position}, {batching}")
            stats = engine.last_stats
            for step, position, slot in stats.admissions:
                slots_seen[order[position]].add(slot)
                late += step > 0
            preempted += stats.preemptions
            replayed += stats.replayed_tokens
            calls += stats.decode_calls
            steps += stats.steps
            assert stats.prefills == 12 + stats.preemptions
    # The runs did cover what the claim is about: slots, late arrivals, preemptions.
    assert sum(len(s) > 1 for s in slots_seen.values()) >= 8
    assert late >= 20 and preempted >= 3 and replayed > 0
    # Several steps per decode call, so tokens fell at every offset within a call.
    assert steps >= 2 * calls


def test_a_token_is_the_same_whichever_decode_call_and_offset_it_falls_in(engine, alone):
    prompts, params, seeds = WORKLOAD
    i = max(range(len(alone)), key=lambda j: alone[j].tokens.size)
    # Alone, the request's tokens fall at offsets 0..7 of calls of 8 steps. Beside short requests
    # that end a call every 3 steps while others wait, they fall elsewhere.
    short = SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True)
    out = engine.generate(
        [prompts[i]] + [[5, 6, 7]] * 9, [params[i]] + [short] * 9, [seeds[i]] + list(range(9))
    )
    _assert_same(out[0], alone[i], f"request {i} beside short requests")
    assert alone[i].tokens.size > 8 and engine.last_stats.decode_calls >= 4
    engine.generate([prompts[i]], [params[i]], [seeds[i]])
    assert engine.last_stats.decode_calls == -(-alone[i].tokens.size // 8)


@settings(max_examples=25)
@given(data=st.data())
def test_any_subset_in_any_order_gives_each_request_its_own_completion(engine, alone, data):
    chosen = data.draw(st.lists(st.integers(0, 11), min_size=1, max_size=9, unique=True))
    chosen = data.draw(st.permutations(chosen))
    prompts, params, seeds = WORKLOAD
    out = engine.generate(
        [prompts[i] for i in chosen], [params[i] for i in chosen], [seeds[i] for i in chosen]
    )
    for c, i in zip(out, chosen, strict=True):
        _assert_same(c, alone[i], f"request {i}")


def _padded(sequences):
    tokens = np.zeros((len(sequences), MAX_SEQ), np.int32)
    mask = np.zeros((len(sequences), MAX_SEQ), bool)
    for b, seq in enumerate(sequences):
        tokens[b, : len(seq)], mask[b, : len(seq)] = seq, True
    return tokens, mask


def test_greedy_equals_repeated_full_forward_argmax(engine, model):
    gen = np.random.default_rng(4)
    prompts = [gen.integers(3, CONFIG.vocab_size, n).tolist() for n in (1, 5, 9, 17)]
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    out = engine.generate(prompts, greedy, [0, 1, 2, 3])
    sequences = [list(p) for p in prompts]
    for _ in range(12):  # one token per full forward pass over everything so far
        logits = np.asarray(forward(model.params, *_padded(sequences), config=CONFIG))
        for b, seq in enumerate(sequences):
            seq.append(int(np.argmax(logits[b, len(seq) - 1])))
    for c, prompt, seq in zip(out, prompts, sequences, strict=True):
        assert c.tokens.tolist() == seq[len(prompt):]


@pytest.mark.slow
def test_logprobs_match_the_training_forward(engine, model):
    prompts, params, seeds = WORKLOAD
    out = engine.generate(prompts, params, seeds)
    logits = np.asarray(
        forward(
            model.params,
            *_padded([p + c.tokens.tolist() for p, c in zip(prompts, out, strict=True)]),
            config=CONFIG,
        )
    )
    diffs = []
    for b, (c, p) in enumerate(zip(out, params, strict=True)):
        rows = logits[b, c.prompt_len - 1 : c.prompt_len - 1 + c.tokens.size]
        trainer = np.asarray(token_logprobs(rows, c.tokens, p.temperature))
        diffs.append(np.abs(trainer - c.logprobs))
    diffs = np.concatenate(diffs)
    print(f"engine vs trainer log-probs over {diffs.size} tokens: "
          f"max |d| = {diffs.max():.2e}, mean |d| = {diffs.mean():.2e}")
    assert diffs.max() <= LOGPROB_TOL


def test_no_compilation_after_warm_up(engine):
    events = []

    def listen(event, duration, **kwargs):
        if event.startswith("/jax/core/compile"):
            events.append(event)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        # Every bucket (prompts of 1..20 tokens use 16 and 32), preemptions, both batchings.
        prompts, params, seeds = _workload(10, seed=9)
        engine.generate(prompts, params, seeds)
        assert engine.last_stats.preemptions > 0
        engine.generate(prompts[:3], params[:3], seeds[:3], batching="static")
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert events == []


def test_new_weights_without_recompiling(engine, model):
    prompts, params, seeds = WORKLOAD
    before = engine.generate(prompts[:4], params[:4], seeds[:4])
    other = widened_model(seed=7)
    engine.update_params(other.params)
    try:
        changed = engine.generate(prompts[:4], params[:4], seeds[:4])
    finally:
        engine.update_params(model.params)
    assert any(
        a.tokens.tolist() != b.tokens.tolist() for a, b in zip(before, changed, strict=True)
    )
    # A new engine of the same batch shape, with a pool of another size, gives the same bits.
    bigger = Engine(other, **{**ENGINE, "num_pages": 37})
    assert bigger.batch_shape == engine.batch_shape == {
        "max_slots": 4, "page_size": 4, "max_seq_len": 32, "prefill_buckets": [16, 32],
        "prefill_tokens": 64, "attention_impl": "reference", "decode_steps": 8,
    }
    fresh = bigger.generate(prompts[:4], params[:4], seeds[:4])
    for a, b in zip(changed, fresh, strict=True):
        _assert_same(a, b, "update_params vs a new engine")
    with pytest.raises(UsageError, match="do not match the engine's model"):
        engine.update_params({"embed_tokens": other.params["embed_tokens"]})


@pytest.mark.parametrize(
    "prompts, params, seeds, message",
    [
        ([[]], SamplingParams(), [0], "request 0: a prompt is a non-empty list of token ids"),
        ([[1, 53]], SamplingParams(), [0], r"request 0: a prompt's token ids must be in \[0, 53\)"),
        ([[1], [2.5]], SamplingParams(), [0, 1], "request 1: a prompt is a non-empty list"),
        ([[1]], SamplingParams(max_tokens=32), [0],
         r"request 0: prompt of 1 tokens \+ max_tokens 32 = 33 exceeds the engine's max_seq_len"),
        ([[1] * 33], SamplingParams(), [0], "longer than the largest prefill bucket, 32"),
        ([[1]], SamplingParams(stop_token_ids=(60,)), [0], r"stop_token_ids \[60\] are not in"),
        ([[1]], [SamplingParams()] * 2, [0], "got 1 prompts, 2 sampling params, 1 seeds and 1 feeds"),
        ([[1]], SamplingParams(), [-4], "seed -4 is not accepted"),
        ([[1]], [{"temperature": 1.0}], [0], "is not a SamplingParams"),
    ],
)
def test_bad_requests_are_rejected(engine, prompts, params, seeds, message):
    with pytest.raises(UsageError, match=message):
        engine.generate(prompts, params, seeds)


def test_bad_engine_settings_are_rejected(engine, model):
    with pytest.raises(UsageError, match="batching='eager' is not accepted; accepted: continuous"):
        engine.generate([[1]], SamplingParams(), [0], batching="eager")
    with pytest.raises(UsageError, match="max_slots=0 is not accepted"):
        Engine(model, max_slots=0, page_size=4, num_pages=8)
    with pytest.raises(UsageError, match="max_seq_len=128 is not accepted; the model's"):
        Engine(model, max_slots=1, page_size=4, num_pages=64, max_seq_len=128)
    with pytest.raises(UsageError, match="attention_impl='flash' is not accepted; accepted: ref"):
        Engine(model, max_slots=1, page_size=4, num_pages=8, attention_impl="flash")
    with pytest.raises(UsageError, match="num_pages=1 is not accepted"):
        Engine(model, max_slots=1, page_size=4, num_pages=1)
    assert engine.generate([], SamplingParams(), []) == []


def test_requests_with_one_prompt_admitted_together_are_prefilled_once_with_the_same_bits(engine, alone):
    """A group of samples of one prompt: the first is prefilled, the others get copies of its
    pages and logits, and each completion is the one the request gets on its own — also when the
    copies outnumber the slots, are preempted and come back."""
    prompts, params, seeds = WORKLOAD
    picks = [0, 3, 0, 5, 3, 0, 0, 5, 3, 0]  # three prompts, 5, 3 and 2 times, in an interleaved order
    for batching in ("continuous", "static"):
        out = engine.generate([prompts[i] for i in picks], [params[i] for i in picks], [seeds[i] for i in picks],
                              batching=batching)
        for position, i in enumerate(picks):
            _assert_same(out[position], alone[i], f"request {i} at {position}, {batching}")
        stats = engine.last_stats
        assert stats.prefills + stats.prefill_copies == len(picks) + stats.preemptions
        assert stats.prefill_copies >= 1
    # Two identical requests: the same completion twice, from one prefill.
    twice = engine.generate([prompts[1]] * 2, [params[1]] * 2, [seeds[1]] * 2)
    assert engine.last_stats.prefills == 1 and engine.last_stats.prefill_copies == 1
    for c in twice:
        _assert_same(c, alone[1], "request 1 twice")


def test_admission_by_prompt_length_admits_the_shortest_first_and_changes_no_completion(model, alone):
    """The same workload, admitted shortest prompt first (a group together): every request gets its
    own completion, the results and the admissions keep the caller's numbering, and the order is
    the one ``admission_order`` gives."""
    from runtime.inference.engine import admission_order

    prompts, params, seeds = WORKLOAD
    picks = [0, 3, 0, 5, 3, 0, 0, 5, 3, 0, 1]
    by_length = Engine(model, **ENGINE, admission="prompt_length")
    seen = []

    def then(request, completion):
        seen.append(request)
        return None

    out = by_length.generate([prompts[i] for i in picks], [params[i] for i in picks], [seeds[i] for i in picks],
                             then=then)
    for position, i in enumerate(picks):
        _assert_same(out[position], alone[i], f"request {i} at {position}")
    lengths = [len(prompts[i]) for i in picks]
    order = admission_order([np.array(prompts[i], np.int32) for i in picks], [np.zeros(0, np.int32)] * len(picks),
                            "prompt_length")
    assert [lengths[r] for r in order] == sorted(lengths)
    assert [picks[r] for r in order] == sorted(picks, key=lambda i: (len(prompts[i]), picks.index(i)))
    stats = by_length.last_stats
    firsts = list(dict.fromkeys(r for _, r, _ in stats.admissions))  # first admission of each request
    assert firsts == order and sorted(seen) == list(range(len(picks)))
    with pytest.raises(UsageError, match="admission='longest' is not accepted; accepted: arrival, prompt_length"):
        Engine(model, **ENGINE, admission="longest")
