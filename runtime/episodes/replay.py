"""Replay an episode from its record, without the tools; and check the tools against the record.

``RecordedTools`` stands in for the tools: the n-th call gets the n-th recorded result, after its
tool name and arguments are checked against the record (a different call is a divergence).
``replay_episode`` re-derives a whole episode from the recorded sampled ids with it (no tool runs)
and compares every appended id, call and the reward with the record: bit-exact, or an
``EpisodeDivergence`` naming the turn and the field.

``check_tools`` does the opposite: it runs every recorded call again with the real tools and
compares each result with the record (all but the wall time). A tool that gives another result
for the same call (it reads the clock, randomness, the network) is named in a ``ToolDivergence``,
never silently accepted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from runtime.episodes.environment import LiveTools, ToolEnvironment
from runtime.episodes.episode import Episode, EpisodeError
from runtime.episodes.tools import Status, Tool, ToolCall, ToolResult
from runtime.tasks.base import Problem


class EpisodeDivergence(EpisodeError):
    """A replayed episode differs from its record (the message names the turn and the field)."""


class RecordedTools:
    """The recorded results of an episode's tool calls, returned in order; no tool runs."""

    def __init__(self, calls: Sequence[ToolCall]):
        # a malformed call ran nothing and is re-derived by the rule, so the runner never sees it
        self._calls = [c for c in calls if c.result.status is not Status.MALFORMED]
        self._next = 0

    def __call__(self, tool: str, arguments: str) -> ToolResult:
        if self._next >= len(self._calls):
            raise EpisodeDivergence(f"tool call {self._next + 1} ({tool}) is not in the record, which has "
                                    f"{len(self._calls)}")
        recorded = self._calls[self._next]
        if (recorded.tool, recorded.arguments) != (tool, arguments):
            raise EpisodeDivergence(f"tool call {self._next + 1}: the record has {recorded.tool}({recorded.arguments[:60]!r}), "
                                    f"the replay asks {tool}({arguments[:60]!r})")
        self._next += 1
        return recorded.result


def replay_environment(env: ToolEnvironment, episode: Episode, *, score: bool = True) -> ToolEnvironment:
    """``env`` with its tools replaced by ``episode``'s recorded results."""
    replay = ToolEnvironment(env.task, env.turns, env.rule, RecordedTools(episode.calls), max_calls=env.max_calls,
                             score=score)
    replay.tool_specs = env.tool_specs
    return replay


def within_budget(ids: np.ndarray, left: int) -> np.ndarray:
    """The result ids that fit in ``left`` ids of an episode's budget (all, or the first ``left``)."""
    return ids[:max(left, 0)]


def replay_episode(env: ToolEnvironment, problem: Problem, episode: Episode, *,
                   max_tokens: int | None = None) -> Episode:
    """Re-derive ``episode`` from its recorded sampled ids with no tool run, and check that every
    turn's appended ids, call, where it ends and (for a finished episode) the reward equal the
    record; else ``EpisodeDivergence`` naming the turn.

    ``max_tokens``, an episode's whole budget after the prompt (``EpisodeSampler``'s), cuts a result
    that does not fit and ends the episode when the budget is spent, as sampling did. An episode
    without a reward (a run's, scored by its verifier) is re-derived without scoring."""
    score = episode.reward is not None
    replay = replay_environment(env, episode, score=score)
    derived = Episode(replay.reset(problem))
    if not np.array_equal(derived.prompt, episode.prompt):
        raise EpisodeDivergence("the prompt ids differ from the record")
    used = 0
    for i, turn in enumerate(episode.turns, 1):
        used += turn.sampled.size
        result = replay.step(turn.sampled)
        appended = result.ids if max_tokens is None else within_budget(result.ids, max_tokens - used)
        used += appended.size
        if not np.array_equal(appended, turn.appended):
            raise EpisodeDivergence(f"turn {i}: the appended ids differ from the record")
        if result.call != turn.call:
            raise EpisodeDivergence(f"turn {i}: the tool call differs from the record")
        derived = derived.add(dataclasses.replace(turn, appended=appended, call=result.call))
        ends = result.done or (max_tokens is not None and used >= max_tokens)
        if ends != (i == len(episode.turns)):
            raise EpisodeDivergence(f"turn {i}: the replay {'ends' if ends else 'goes on'} where the record "
                                    f"{'goes on' if ends else 'ends'}")
        if result.done and score:
            derived = derived.finish(result.reward)
    if derived.reward != episode.reward:
        raise EpisodeDivergence(f"the reward {derived.reward} differs from the recorded {episode.reward}")
    return derived


@dataclasses.dataclass(frozen=True)
class ToolDivergence:
    """A recorded call whose tool gave another result when run again.

    Attributes:
      call: the call's index among the episode's calls (1-based).
      tool: the tool's name: the one that is not deterministic.
      fields: the result fields that differ.
      recorded: the recorded result.
      rerun: the result of running it again.
    """

    call: int
    tool: str
    fields: tuple[str, ...]
    recorded: ToolResult
    rerun: ToolResult

    def describe(self) -> str:
        return (f"tool {self.tool!r} is not deterministic: call {self.call} gave another "
                f"{', '.join(self.fields)} than the record")


def check_tools(episode: Episode, tools: Mapping[str, Tool]) -> list[ToolDivergence]:
    """Run every recorded call of ``episode`` again and name each result that differs."""
    live = LiveTools(dict(tools))
    found = []
    for i, call in enumerate(episode.calls, 1):
        if call.result.status is Status.MALFORMED:
            continue
        rerun = live(call.tool, call.arguments)
        if call.result != rerun:
            found.append(ToolDivergence(i, call.tool, tuple(call.result.differences(rerun)), call.result, rerun))
    return found
