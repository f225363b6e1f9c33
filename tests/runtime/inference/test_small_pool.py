"""``inference.kv_pages``: a KV pool sized to the tokens actually live instead of the worst case.

When the pool runs out the youngest sequence is preempted and recomputed later; its tokens are
the same whatever the preemption pattern, so a run's digest does not depend on the pool's size.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from runtime.config import ConfigError, load_config
from runtime.errors import UsageError
from runtime.inference import SamplingParams
from runtime.session import EngineShape, build_session
from tests.runtime.small_run import tiny_config, write_sums


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    root = tmp_path_factory.mktemp("small_pool")
    write_sums(root / "sums.jsonl")
    config = tiny_config(str(root / "sums.jsonl"), str(tmp_path_factory.getbasetemp() / "warm_start"))
    return build_session(config, log=lambda m: None)


def test_a_pool_just_over_one_longest_sequence_preempts_all_but_the_oldest_and_gives_the_same_tokens(session):
    assert session.shape.pages == 0 and session.shape.slots == 8
    # pages of 2 tokens: a sequence grows into new pages as it decodes, so a short pool preempts
    shape = dataclasses.replace(session.shape, page_size=2, pages_per_seq=-(-session.width // 2))
    small = dataclasses.replace(shape, pages=shape.pages_per_seq + 1)
    rng = np.random.default_rng(0)
    prompt_len = shape.buckets[0]
    vocab = session.model.config.vocab_size
    prompts = [rng.integers(3, vocab, prompt_len).astype(np.int32) for _ in range(4) for _ in range(4)]  # 4 groups
    params = SamplingParams(temperature=1.0, max_tokens=session.config.max_tokens, ignore_eos=True)
    seeds = list(range(100, 116))
    full = shape.build(session.model)
    want = full.generate(prompts, params, seeds)
    assert full.last_stats is not None and full.last_stats.preemptions == 0
    tight = small.build(session.model)
    got = tight.generate(prompts, params, seeds)
    stats = tight.last_stats
    assert stats is not None and stats.preemptions >= len(prompts) - 1, stats  # all but the oldest, at least once
    for a, b in zip(want, got, strict=True):
        assert np.array_equal(a.tokens, b.tokens)
        assert np.array_equal(np.asarray(a.logprobs), np.asarray(b.logprobs))


def test_a_pool_smaller_than_one_sequence_is_refused_in_one_line(session):
    config = dataclasses.replace(session.config, inference=dataclasses.replace(session.config.inference, kv_pages=2),
                                 workers=dataclasses.replace(session.config.workers, page_size=2))
    assert session.width > 4  # so one sequence needs more than 2 pages of 2 tokens
    with pytest.raises(UsageError) as e:
        EngineShape.for_run(config, session.width)
    assert "inference.kv_pages: 2 is not accepted" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=">= 0"):
        load_config(None, ["inference.kv_pages=-1"])


def test_a_run_with_a_small_pool_ends_on_the_digest_of_the_full_pool(session, tmp_path):
    from runtime.run import run

    config = dataclasses.replace(session.config, workers=dataclasses.replace(session.config.workers, page_size=2))
    pages = -(-session.width // 2) + 1
    small = dataclasses.replace(config, inference=dataclasses.replace(config.inference, kv_pages=pages))
    full = run(config, str(tmp_path / "full"), progress=False, log=lambda m: None)
    tight = run(small, str(tmp_path / "small"), progress=False, log=lambda m: None)
    assert tight["final_digest"] == full["final_digest"] and tight["steps"] == full["steps"] > 0
