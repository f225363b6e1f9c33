"""Requests of several turns (``Engine.generate``'s ``then``): a request that goes on keeps its
slot and KV pages and feeds the continuation's ids through the decode step, so each turn has the
bits of a fresh request fed the same ids (``feeds``), with the pages kept or the request
preempted and recomputed between and within turns."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from runtime.errors import UsageError
from runtime.inference import Completion, Continuation, Engine, SamplingParams
from tests.runtime.inference.conftest import ENGINE

TURNS = 3
PARAMS = SamplingParams(temperature=1.0, max_tokens=4)


def _appended(request: int, turn: int) -> list[int]:
    """The ids an environment appends after turn ``turn`` of ``request`` (none after the second
    turn of an odd request: it samples again at once)."""
    if request % 2 and turn == 1:
        return []
    return [10 + request, 20 + turn, 30 + request + turn][: 1 + (request + turn) % 3]


class Script:
    """A ``then`` that goes on ``TURNS`` turns, appending ``_appended``; it records every turn."""

    def __init__(self):
        self.turns: dict[int, list[Completion]] = {}

    def __call__(self, request: int, turn: Completion) -> Continuation | None:
        done = self.turns.setdefault(request, [])
        done.append(turn)
        if len(done) == TURNS:
            return None
        params = dataclasses.replace(PARAMS, temperature=0.5 * len(done), max_tokens=3 + len(done))
        return Continuation(_appended(request, len(done) - 1), params, 1000 + 10 * request + len(done))


def _requests(n: int = 6):
    rng = np.random.default_rng(7)
    prompts = [rng.integers(3, 53, 3 + 2 * (i % 3)).astype(np.int32) for i in range(n)]
    prompts[1] = prompts[0]  # a group: the two share prompt pages
    return prompts, [100 + i for i in range(n)]


def _same(a: Completion, b: Completion, what: str) -> None:
    assert a.tokens.tolist() == b.tokens.tolist(), what
    assert a.logprobs.tobytes() == b.logprobs.tobytes(), what
    assert (a.finish_reason, a.prompt_len) == (b.finish_reason, b.prompt_len), what


@pytest.fixture(scope="module")
def roomy(model) -> Engine:
    """Pages for every slot's longest sequence: nobody is preempted."""
    return Engine(model, **{**ENGINE, "num_pages": ENGINE["max_slots"] * 8 + 1})


def test_each_turn_has_the_bits_of_a_fresh_request_fed_the_same_ids(roomy):
    prompts, seeds = _requests()
    script = Script()
    last = roomy.generate(prompts, PARAMS, seeds, then=script)
    stats = roomy.last_stats
    assert stats.preemptions == 0 and stats.turns == TURNS * len(prompts)
    assert stats.fed_tokens == sum(len(_appended(r, k)) for r in range(len(prompts)) for k in range(TURNS - 1))
    for request, turns in sorted(script.turns.items()):
        assert len(turns) == TURNS
        _same(last[request], turns[-1], f"request {request}: the last turn is returned")
        fed: list[int] = []
        for k, turn in enumerate(turns):
            params = PARAMS if k == 0 else dataclasses.replace(PARAMS, temperature=0.5 * k, max_tokens=3 + k)
            seed = seeds[request] if k == 0 else 1000 + 10 * request + k
            (fresh,) = roomy.generate([prompts[request]], params, [seed], feeds=[fed])
            _same(turn, fresh, f"request {request}, turn {k}")
            assert turn.prompt_len == prompts[request].size + len(fed)
            fed += turn.tokens.tolist() + (_appended(request, k) if k < TURNS - 1 else [])


def test_a_small_pool_preempts_within_and_between_turns_and_changes_no_bit(roomy, engine):
    prompts, seeds = _requests(8)
    kept = Script()
    roomy.generate(prompts, PARAMS, seeds, then=kept)
    assert roomy.last_stats.preemptions == 0
    tight = Script()
    engine.generate(prompts, PARAMS, seeds, then=tight)
    stats = engine.last_stats
    assert stats.preemptions > 0 and stats.replayed_tokens > 0, stats
    assert stats.fed_tokens > roomy.last_stats.fed_tokens  # continuation ids fed again after preemptions
    for request in range(len(prompts)):
        for k, (a, b) in enumerate(zip(kept.turns[request], tight.turns[request], strict=True)):
            _same(a, b, f"request {request}, turn {k}")


def test_static_batching_gives_the_same_turns(roomy):
    prompts, seeds = _requests()
    a, b = Script(), Script()
    roomy.generate(prompts, PARAMS, seeds, then=a)
    roomy.generate(prompts, PARAMS, seeds, then=b, batching="static")
    for request in range(len(prompts)):
        for x, y in zip(a.turns[request], b.turns[request], strict=True):
            _same(x, y, f"request {request}")


@pytest.mark.parametrize(
    "more, message",
    [
        (Continuation([53], PARAMS, 1), r"request 0's continuation's token ids must be in \[0, 53\)"),
        (Continuation([5] * 30, PARAMS, 1), r"request 0's continuation: the sequence of \d+ tokens \+ max_tokens 4"),
        (Continuation([5], {"temperature": 1.0}, 1), "is not a SamplingParams"),
        (Continuation([5], SamplingParams(stop_token_ids=(60,)), 1),
         r"request 0's continuation: stop_token_ids \[60\] are not in \[0, 53\)"),
        (Continuation([5], PARAMS, -1), "seed -1 is not accepted"),
        ([5], "is not a Continuation"),
    ],
)
def test_a_bad_continuation_is_refused_in_one_line_and_the_engine_still_works(roomy, more, message):
    with pytest.raises(UsageError, match=message) as e:
        roomy.generate([[4, 5, 6]], PARAMS, [1], then=lambda request, turn: more)
    assert "\n" not in str(e.value)
    prompts, seeds = _requests(2)
    want = [roomy.generate([p], PARAMS, [s])[0] for p, s in zip(prompts, seeds, strict=True)]
    for a, b in zip(roomy.generate(prompts, PARAMS, seeds), want, strict=True):
        _same(a, b, "after a refused continuation")


def test_bad_feeds_are_refused(roomy):
    with pytest.raises(UsageError, match=r"request 0: a feed's token ids must be in \[0, 53\)"):
        roomy.generate([[4]], PARAMS, [1], feeds=[[60]])
    with pytest.raises(UsageError, match=r"request 0: prompt and feed of 30 tokens \+ max_tokens 4 = 34 exceeds"):
        roomy.generate([[4]], PARAMS, [1], feeds=[[5] * 29])
    with pytest.raises(UsageError, match="1 prompts, 1 sampling params, 1 seeds and 2 feeds"):
        roomy.generate([[4]], PARAMS, [1], feeds=[[5], [6]])
