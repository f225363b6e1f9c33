"""The engine with the live-page decode attention (``attention_impl="live"``, the default of new
runs off TPU): the engine's batch-invariance, agreement and compilation tests, run again on an
engine whose sequences span up to 8 pages, so the attention loop's length varies with the
longest live sequence of each decode call."""

from __future__ import annotations

import pytest

from runtime.inference import Engine
from tests.runtime.inference.conftest import ENGINE
from tests.runtime.inference.test_engine import (  # noqa: F401 (collected here, with this module's engine)
    alone,
    test_a_request_is_the_same_alone_in_a_full_batch_in_any_order_and_after_preemption,
    test_a_token_is_the_same_whichever_decode_call_and_offset_it_falls_in,
    test_any_subset_in_any_order_gives_each_request_its_own_completion,
    test_completions_are_well_formed,
    test_greedy_equals_repeated_full_forward_argmax,
    test_logprobs_match_the_training_forward,
    test_no_compilation_after_warm_up,
)


@pytest.fixture(scope="module")
def engine(model) -> Engine:
    engine = Engine(model, **ENGINE, attention_impl="live")
    assert engine.batch_shape["attention_impl"] == "live"
    return engine
