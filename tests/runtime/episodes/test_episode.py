"""The training row of an episode is exactly its recorded ids, masked on the model's tokens only."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.episodes import Episode, EpisodeError, Status, ToolCall, ToolResult, Turn

ids = st.lists(st.integers(0, 50_000), max_size=12)
turns = st.lists(st.tuples(ids, ids, st.booleans()), max_size=8)


def _turn(sampled, appended, with_call, seed=0):
    logprobs = -np.random.default_rng(seed).random(len(sampled)).astype(np.float32)
    call = ToolCall("calculator", "1+1", ToolResult.of(b"2", 0, 0.0, Status.OK)) if with_call else None
    return Turn(sampled, logprobs, appended, call)


@given(ids, turns)
def test_row_is_the_concatenation_and_the_mask_is_the_models_tokens(prompt, recorded):
    episode = Episode(prompt)
    for i, (sampled, appended, with_call) in enumerate(recorded):
        episode = episode.add(_turn(sampled, appended, with_call, seed=i))
    row = episode.finish(1.0).row()

    expected = list(prompt)
    model = [False] * len(prompt)
    behaviour: list[float] = [0.0] * len(prompt)
    for turn in episode.turns:
        expected += turn.sampled.tolist() + turn.appended.tolist()
        model += [True] * turn.sampled.size + [False] * turn.appended.size
        behaviour += turn.logprobs.tolist() + [0.0] * turn.appended.size
    assert row.ids.dtype == np.int32 and row.ids.tolist() == expected
    assert row.mask.dtype == np.bool_ and row.mask.tolist() == model
    assert row.logprobs.dtype == np.float32 and row.logprobs.tobytes() == np.asarray(behaviour, np.float32).tobytes()
    assert int(row.mask.sum()) == sum(t.sampled.size for t in episode.turns)
    assert row.prompt_len == len(prompt)
    # the mask's True positions hold exactly the sampled ids, in order
    assert row.ids[row.mask].tolist() == [i for t in episode.turns for i in t.sampled.tolist()]
    assert episode.context().tolist() == expected


def test_an_episode_is_a_value():
    start = Episode([1, 2])
    one = start.add(_turn([3], [4, 5], True))
    assert start.turns == () and len(one.turns) == 1
    assert one == Episode([1, 2], (_turn([3], [4, 5], True),))
    assert one.calls[0].tool == "calculator"
    done = one.finish(0.5)
    assert done.done and not one.done
    with pytest.raises(EpisodeError, match="finished"):
        done.add(_turn([6], [], False))
    with pytest.raises(EpisodeError, match="2 sampled ids but 1 log-probs"):
        Turn([1, 2], [0.0], [])
    with pytest.raises(ValueError):
        one.turns[0].sampled[0] = 9  # recorded ids are read-only
