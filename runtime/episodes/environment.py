"""The environment protocol, and an environment whose actions are tool calls or a final answer.

``reset(problem)`` gives the first observation's ids; ``step(action)`` takes the ids the model
sampled for one turn and says what happened: a ``tool_result`` (the ids to append before the
model's next turn, and the call's record) or the ``final`` answer (its reward; nothing appended).
Reading the call (``parsing``), rendering the result (``turns``) and scoring the answer are pure;
only running a tool does I/O, through ``ToolRunner``, which a replay swaps for the record.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np

from runtime.episodes.episode import Episode, EpisodeError, Turn
from runtime.episodes.parsing import Rule, rule_digest
from runtime.episodes.tools import Status, Tool, ToolCall, ToolResult
from runtime.episodes.turns import Action, TurnFormat
from runtime.tasks.base import Problem, Task
from verifiers.outcome import Outcome


class StepKind(str, enum.Enum):
    TOOL_RESULT = "tool_result"
    FINAL = "final"


@dataclasses.dataclass(frozen=True, eq=False)
class StepResult:
    """What one ``step`` did.

    Attributes:
      kind: ``tool_result`` (the episode goes on) or ``final``.
      ids: int32 the ids the environment appends after the action (empty when final).
      reward: the episode's reward when ``done``, else 0.
      done: the episode is over.
      call: the turn's tool call record (None for the final answer).
      outcome: the verifier's outcome of the final answer (None before).
    """

    kind: StepKind
    ids: np.ndarray
    reward: float
    done: bool
    call: ToolCall | None = None
    outcome: Outcome | None = None


class Environment(Protocol):
    def reset(self, problem: Problem) -> np.ndarray: ...

    def step(self, action: Action) -> StepResult: ...


class ToolRunner(Protocol):
    """Runs (or looks up) the result of a call of ``tool`` with ``arguments``."""

    def __call__(self, tool: str, arguments: str) -> ToolResult: ...


@dataclasses.dataclass(frozen=True)
class LiveTools:
    """Runs calls with the real tools; a name that is not one of them is an ``unknown_tool`` result."""

    tools: Mapping[str, Tool]

    def __call__(self, tool: str, arguments: str) -> ToolResult:
        found = self.tools.get(tool)
        if found is None:
            return ToolResult.refused(Status.UNKNOWN_TOOL, f"no tool {tool!r}; tools: {', '.join(sorted(self.tools))}")
        return found.run(arguments)


class ToolEnvironment:
    """A problem of ``task`` answered over several turns, with tool calls read by ``rule``.

    Args:
      task: scores the final answer (``task.score``, ``task.reward``).
      turns: the turn format (the model's tokenizer and template).
      rule: the tool-call rule.
      tools: the tools, by name (or a ``ToolRunner`` such as a replay's record).
      max_calls: tool calls an episode may make; a call past it ends the episode with the
        action scored as the final answer.
      score: score the final answer with ``task`` (False: its reward is 0 and its outcome None,
        for a run whose verifier scores it).

    One environment serves one live episode at a time (``reset`` starts the next one).
    """

    def __init__(self, task: Task, turns: TurnFormat, rule: Rule, tools: Mapping[str, Tool] | ToolRunner,
                 *, max_calls: int = 4, score: bool = True):
        if not isinstance(max_calls, int) or max_calls < 0:
            raise EpisodeError(f"max_calls={max_calls!r} must be an integer >= 0")
        self.task, self.turns, self.rule, self.max_calls, self.score = task, turns, rule, max_calls, score
        self.runner: ToolRunner = LiveTools(dict(tools)) if isinstance(tools, Mapping) else tools
        self.tool_specs: dict[str, dict] = (
            {name: tool.describe() for name, tool in sorted(tools.items())} if isinstance(tools, Mapping) else {})
        self._problem: Problem | None = None
        self._calls = 0

    def describe(self) -> dict:
        """The rule (with its digest), the call bound and the tools' limits: what a replay must read
        calls with, and what produced the recorded results."""
        return {"rule": self.rule.describe(), "rule_digest": rule_digest(self.rule), "max_calls": self.max_calls,
                "tools": self.tool_specs}

    def reset(self, problem: Problem) -> np.ndarray:
        self._problem, self._calls = problem, 0
        return self.turns.prompt_ids(problem)

    def step(self, action: Action) -> StepResult:
        if self._problem is None:
            raise EpisodeError("step before reset")
        problem = self._problem
        text = self.turns.decode(action)
        parsed = self.rule.parse(text)
        if not parsed.call or self._calls >= self.max_calls:
            self._problem = None
            if not self.score:
                return StepResult(StepKind.FINAL, np.zeros(0, np.int32), 0.0, True)
            outcome = self.task.score([problem], [text])[0]
            return StepResult(StepKind.FINAL, np.zeros(0, np.int32), float(self.task.reward(outcome)), True,
                              outcome=outcome)
        self._calls += 1
        if parsed.malformed:
            call = ToolCall("", text, ToolResult.refused(Status.MALFORMED, parsed.malformed))
        else:
            call = ToolCall(parsed.tool, parsed.arguments, self.runner(parsed.tool, parsed.arguments))
        ids = self.turns.result_ids(problem, action, call.result.text())
        return StepResult(StepKind.TOOL_RESULT, ids, 0.0, False, call=call)


Policy = Callable[[np.ndarray, int], tuple[Sequence[int] | np.ndarray, Sequence[float] | np.ndarray]]
"""The model, as far as an episode sees it: the context ids and the turn's index in, that turn's
sampled ids and their log-probs out."""


def run_episode(env: Environment, problem: Problem, policy: Policy, *, max_turns: int = 16) -> Episode:
    """One episode of ``problem``: reset, then policy and step until done (or ``max_turns``)."""
    episode = Episode(env.reset(problem))
    for turn in range(max_turns):
        sampled, logprobs = policy(episode.context(), turn)
        result = env.step(sampled)
        episode = episode.add(Turn(np.asarray(sampled), np.asarray(logprobs), result.ids, result.call))
        if result.done:
            return episode.finish(result.reward)
    raise EpisodeError(f"the episode did not end within {max_turns} turns")
