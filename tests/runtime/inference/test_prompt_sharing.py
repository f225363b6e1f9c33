"""Prompt sharing: a group's samples reference its prompt's full KV pages, copy only the partial
one, and get the bits each would get alone, however small the pool and whoever shares with whom."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.inference import Engine, SamplingParams
from tests.runtime.inference.conftest import CONFIG, ENGINE

MAX_SEQ = ENGINE["max_seq_len"]
# (page size, spare pages): pools of one longest sequence's pages plus ``spare``, so that a few
# requests at once run out and the youngest are preempted on most steps.
POOLS = ((2, 1), (3, 0), (8, 2))


@pytest.fixture(scope="module")
def engines(model):
    built = {}
    for page_size, spare in POOLS:
        pages = -(-MAX_SEQ // page_size) + 1 + spare
        built[page_size, spare] = Engine(model, max_slots=4, page_size=page_size, num_pages=pages, max_seq_len=MAX_SEQ)
    return built


def _group_workload(groups, seed):
    """Each ``(prompt length, group size)`` as that many samples of one prompt, with their own seeds
    and lengths."""
    gen = np.random.default_rng(seed)
    prompts, params = [], []
    for length, size in groups:
        prompt = gen.integers(3, CONFIG.vocab_size, length).tolist()
        for _ in range(size):
            prompts.append(prompt)
            params.append(SamplingParams(temperature=1.0, max_tokens=int(gen.integers(1, MAX_SEQ - length + 1)),
                                         ignore_eos=True))
    seeds = [int(s) for s in gen.integers(0, 2**63, len(prompts))]
    return prompts, params, seeds


def _assert_alone(engine, prompts, params, seeds, out, cache):
    for i, (prompt, p, seed) in enumerate(zip(prompts, params, seeds, strict=True)):
        key = (id(engine), tuple(prompt), p, seed)
        if key not in cache:
            cache[key] = engine.generate([prompt], [p], [seed])[0]
        alone = cache[key]
        np.testing.assert_array_equal(out[i].tokens, alone.tokens, err_msg=f"request {i}")
        assert out[i].logprobs.tobytes() == alone.logprobs.tobytes(), f"request {i}: log-prob bits differ"


ALONE: dict = {}


@settings(max_examples=60, deadline=None)
@given(
    groups=st.lists(st.tuples(st.integers(1, 20), st.integers(1, 5)), min_size=1, max_size=3),
    pool=st.sampled_from(POOLS),
    interleave=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_each_sample_of_a_shared_prompt_gets_its_bits_alone_in_a_pool_that_preempts(engines, groups, pool, interleave, seed):
    prompts, params, seeds = _group_workload(groups, seed)
    order = list(range(len(prompts)))
    if interleave:  # the groups' members alternate, so that some are admitted apart from their first
        order.sort(key=lambda i: (i - [j for j in range(i + 1) if prompts[j] == prompts[i]][0], i))
    prompts, params, seeds = ([x[i] for i in order] for x in (prompts, params, seeds))
    engine = engines[pool]
    out = engine.generate(prompts, params, seeds)  # the engine asserts that every page came back
    stats = engine.last_stats
    assert stats.prefills + stats.prefill_copies == len(prompts) + stats.preemptions
    _assert_alone(engine, prompts, params, seeds, out, ALONE)


def test_a_group_holds_its_prompt_once_and_gets_the_bits_of_samples_holding_their_own(engine, model):
    """Eight samples of one 14-token prompt at pages of 4: 3 full prompt pages held once, and a
    copy of the partial one each, against 4 prompt pages per sample without sharing."""
    copying = Engine(model, **ENGINE, share_prompts=False)
    prompt = list(range(3, 17))
    params = SamplingParams(temperature=1.0, max_tokens=2, ignore_eos=True)
    shared = Engine(model, **{**ENGINE, "max_slots": 8, "num_pages": 41})
    alone = Engine(model, **{**ENGINE, "max_slots": 8, "num_pages": 41}, share_prompts=False)
    out = shared.generate([prompt] * 8, params, list(range(8)))
    want = alone.generate([prompt] * 8, params, list(range(8)))
    # Sharing: the first holds 4 pages (14 + 1 tokens), the others 1 each; then 16 tokens still fit.
    assert shared.last_stats.peak_pages == 4 + 7 and shared.last_stats.prefills == 1
    assert alone.last_stats.peak_pages == 8 * 4 and alone.last_stats.prefills == 8
    for i, (a, b) in enumerate(zip(out, want, strict=True)):
        np.testing.assert_array_equal(a.tokens, b.tokens, err_msg=f"sample {i}")
        assert a.logprobs.tobytes() == b.logprobs.tobytes(), f"sample {i}: log-prob bits differ"
    # The test engine's pool (20 pages) preempts the copies of a prompt of 20 tokens, not the sharers.
    long = list(range(3, 23))
    few = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)
    got = engine.generate([long] * 4, few, list(range(4)))
    assert engine.last_stats.preemptions == 0
    expected = copying.generate([long] * 4, few, list(range(4)))
    assert copying.last_stats.preemptions > 0
    for a, b in zip(got, expected, strict=True):
        assert a.tokens.tobytes() == b.tokens.tobytes() and a.logprobs.tobytes() == b.logprobs.tobytes()


def test_samples_admitted_after_their_first_share_its_prompt_while_it_runs(model):
    """Six samples of one prompt through two slots: the first runs longest, so each later one is
    admitted in a later plan, takes its pages and prompt logits (the slot's own logits row has
    moved on by then), and still gets its bits alone."""
    prompt = list(range(3, 17))
    params = [SamplingParams(temperature=1.0, max_tokens=n, ignore_eos=True) for n in (12, 1, 2, 1, 3, 2)]
    seeds = list(range(6))
    shared = Engine(model, **{**ENGINE, "max_slots": 2, "num_pages": 41})
    alone = Engine(model, **{**ENGINE, "max_slots": 2, "num_pages": 41}, share_prompts=False)
    out = shared.generate([prompt] * 6, params, seeds)
    want = alone.generate([prompt] * 6, params, seeds)
    assert shared.last_stats.prefills == 1 and shared.last_stats.prefill_copies == 5
    assert alone.last_stats.prefills == 6
    for i, (a, b) in enumerate(zip(out, want, strict=True)):
        np.testing.assert_array_equal(a.tokens, b.tokens, err_msg=f"sample {i}")
        assert a.logprobs.tobytes() == b.logprobs.tobytes(), f"sample {i}: log-prob bits differ"
