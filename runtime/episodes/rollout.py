"""Episodes as rollouts of a run: sampled by the engine turn after turn, recorded in ``RolloutCompleted``.

A multi-turn rollout's ``RolloutCompleted`` holds the episode after its prompt: ``tokens`` is the
concatenation of every turn's sampled ids and the ids the environment appended after them,
``logprobs`` the behaviour log-probs of the sampled ids (0 on appended ids), and ``turns`` one
record per turn: how many ids the model sampled, how many the environment appended, and the
turn's tool call (its tool, arguments, result bytes, exit status, wall time, truncation, status).
The training row is the prompt and ``tokens``; its mask (``completion_mask``) is True exactly on
the sampled ids. The verifier scores the last turn's sampled ids (``final_ids``).

The episode's completion budget is ``sampling.max_tokens`` (sampled and appended ids together);
one turn samples at most ``episodes.turn_tokens`` of it. A tool result that does not fit in what
is left is cut to fit and the episode ends there; an episode ends with ``"length"`` exactly when it
used the whole budget, else ``"stop"`` (the rule ``ledger``'s admission checks for every rollout).

``EpisodeSampler`` samples a batch of episodes in one ``engine.generate``: each episode is a
request that goes on after every turn with the ids its environment appended, on the KV pages it
already holds, and samples each turn with the seed of (rollout seed, turn) (``turn_seed``); the
engine's batch invariance makes each episode independent of the others.
``rederive`` goes the other way for a replay: from a recorded completion it re-derives every
appended id with the recorded tool results (``RecordedTools``; no tool runs) and says where it
differs from the record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from runtime.episodes.environment import StepKind, ToolEnvironment
from runtime.episodes.episode import Episode, EpisodeError, Turn
from runtime.episodes.replay import replay_episode, within_budget
from runtime.episodes.sampling import turn_seed
from runtime.episodes.tools import MAX_RESULT_BYTES, Status, ToolCall, ToolResult
from runtime.errors import UsageError
from runtime.inference.requests import Continuation
from runtime.tasks.base import Problem

FINISH_STOP, FINISH_LENGTH = "stop", "length"
MAX_TURNS = 64
"""Turns one recorded episode may have (a ceiling for what a worker submits)."""
MAX_TEXT = 4096
"""Characters of a recorded call's tool name, arguments or detail."""


def call_record(call: ToolCall | None) -> dict[str, Any] | None:
    """A turn's tool call as recorded in ``RolloutCompleted.turns``."""
    if call is None:
        return None
    return {"tool": call.tool, "arguments": call.arguments, **call.result.to_dict()}


def call_of(record: Mapping[str, Any] | None) -> ToolCall | None:
    """The ``ToolCall`` of a recorded turn (None for the final answer)."""
    if record is None:
        return None
    exit_status = record["exit_status"]
    return ToolCall(record["tool"], record["arguments"],
                    ToolResult(bytes(record["output"]), None if exit_status is None else int(exit_status),
                               float(record["wall_s"]), bool(record["truncated"]), Status(record["status"]),
                               record["detail"]))


@dataclasses.dataclass(frozen=True, eq=False)
class SampledEpisode:
    """A sampled episode, as its ``RolloutCompleted`` will hold it.

    Attributes:
      episode: the episode (its reward unset: the verifier scores it).
      tokens: int32 every id after the prompt.
      logprobs: float32 the behaviour log-probs of ``tokens`` (0 on appended ids).
      turns: the turn records.
      finish_reason: ``"length"`` when the episode used the whole budget, else ``"stop"``.
    """

    episode: Episode
    tokens: np.ndarray
    logprobs: np.ndarray
    turns: tuple
    finish_reason: str


def recorded(episode: Episode, max_tokens: int) -> SampledEpisode:
    """``episode`` in the form of its ``RolloutCompleted`` fields."""
    turns = tuple({"sampled": int(t.sampled.size), "appended": int(t.appended.size), "call": call_record(t.call)}
                  for t in episode.turns)
    if not episode.turns:
        raise EpisodeError("an episode has at least one turn")
    tokens = np.concatenate([np.concatenate([t.sampled, t.appended]) for t in episode.turns]).astype(np.int32)
    logprobs = np.concatenate([np.concatenate([t.logprobs, np.zeros(t.appended.size, np.float32)])
                               for t in episode.turns]).astype(np.float32)
    reason = FINISH_LENGTH if tokens.size == max_tokens else FINISH_STOP
    return SampledEpisode(episode, tokens, logprobs, turns, reason)


def spans(turns: Sequence[Mapping[str, Any]]) -> list[tuple[int, int, int]]:
    """Per turn ``(start, sampled_end, end)`` offsets into the completion's tokens."""
    out, at = [], 0
    for t in turns:
        sampled_end = at + int(t["sampled"])
        end = sampled_end + int(t["appended"])
        out.append((at, sampled_end, end))
        at = end
    return out


def completion_mask(turns: Sequence[Mapping[str, Any]], n: int) -> np.ndarray:
    """bool ``[n]``: True on the model's sampled ids of a completion of ``n`` ids with ``turns``
    (all of them for a single-turn completion, ``turns`` empty)."""
    if not turns:
        return np.ones(n, bool)
    mask = np.zeros(n, bool)
    for start, sampled_end, _ in spans(turns):
        mask[start:sampled_end] = True
    return mask


def final_ids(tokens: np.ndarray, turns: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """The ids the verifier scores: the last turn's sampled ids (the whole completion without turns)."""
    if not turns:
        return tokens
    start, sampled_end, _ = spans(turns)[-1]
    return tokens[start:sampled_end]


def episode_of(prompt: np.ndarray, tokens: np.ndarray, logprobs: np.ndarray,
               turns: Sequence[Mapping[str, Any]]) -> Episode:
    """The episode a ``RolloutCompleted``'s fields record, after ``prompt``."""
    out = []
    for (start, sampled_end, end), t in zip(spans(turns), turns, strict=True):
        out.append(Turn(tokens[start:sampled_end], logprobs[start:sampled_end], tokens[sampled_end:end],
                        call_of(t["call"])))
    return Episode(prompt, tuple(out))


def turns_problem(turns: Any, n: int, max_tokens: int | None) -> str | None:
    """Why ``turns`` cannot be the turn records of a completion of ``n`` ids, or None: a tuple of
    at most ``MAX_TURNS`` records whose lengths add up to ``n`` (each turn samples at least one
    id), every call a record of bounded text and at most ``MAX_RESULT_BYTES`` of output, the
    last turn without appended ids unless the episode used its whole budget."""
    if type(turns) is not tuple:
        return "turns must be a tuple of turn records"
    if not turns:
        return None
    if len(turns) > MAX_TURNS:
        return f"{len(turns)} turns exceed the ceiling of {MAX_TURNS}"
    total = 0
    for i, t in enumerate(turns, 1):
        if not isinstance(t, dict) or set(t) != {"sampled", "appended", "call"}:
            return f"turn {i} must be a record of sampled, appended and call"
        sampled, appended = t["sampled"], t["appended"]
        if type(sampled) is not int or type(appended) is not int or sampled < 1 or appended < 0:
            return f"turn {i}: sampled must be an integer >= 1 and appended an integer >= 0"
        total += sampled + appended
        problem = _call_problem(t["call"])
        if problem is not None:
            return f"turn {i}: {problem}"
    if total != n:
        return f"the turns hold {total} ids but the completion has {n}"
    if turns[-1]["appended"] and (max_tokens is None or n != max_tokens):
        return "the last turn appends ids, which only an episode cut at sampling.max_tokens may"
    return None


_CALL_FIELDS = {"tool", "arguments", "output", "exit_status", "wall_s", "truncated", "status", "detail"}


def _call_problem(call: Any) -> str | None:
    if call is None:
        return None
    if not isinstance(call, dict) or set(call) != _CALL_FIELDS:
        return "a call must be a record of " + ", ".join(sorted(_CALL_FIELDS))
    for name in ("tool", "arguments", "detail"):
        if type(call[name]) is not str or len(call[name]) > MAX_TEXT:
            return f"the call's {name} must be a string of at most {MAX_TEXT} characters"
    if type(call["output"]) is not bytes or len(call["output"]) > MAX_RESULT_BYTES:
        return f"the call's output must be at most {MAX_RESULT_BYTES} bytes"
    if call["exit_status"] is not None and type(call["exit_status"]) is not int:
        return "the call's exit_status must be an integer or none"
    if type(call["wall_s"]) is not float or not 0.0 <= call["wall_s"] < 1e6:
        return "the call's wall_s must be a number of seconds"
    if type(call["truncated"]) is not bool:
        return "the call's truncated must be true or false"
    if call["status"] not in {s.value for s in Status}:
        return f"the call's status {str(call['status'])[:40]!r} is not one of {', '.join(s.value for s in Status)}"
    return None


class EpisodeSampler:
    """Samples episodes with an engine, all of a batch in one ``engine.generate``.

    Each episode is one request of the engine that goes on turn after turn (``then``): when a
    turn ends, its environment steps on the sampled ids, and the ids it appends are fed in the
    request's slot, on the KV pages the episode already holds (kept while the pool allows; a
    preempted episode is recomputed to the same bits), before the next turn is sampled with the
    seed of (rollout seed, turn) (``turn_seed``). Episodes enter and leave slots as they end, not
    turn by turn in lockstep, and the engine's batch invariance makes each episode independent of
    the others.

    Args:
      engine: a ``runtime.inference.Engine`` whose prefill buckets hold the prompts and whose
        ``max_seq_len`` holds a prompt and an episode's whole budget.
      environment: makes a fresh ``ToolEnvironment`` (one per episode of a batch).
      turn_tokens: most ids one turn samples.
    """

    def __init__(self, engine: Any, environment: Callable[[], ToolEnvironment], *, turn_tokens: int):
        self.engine, self.environment, self.turn_tokens = engine, environment, turn_tokens

    def generate(self, problems: Sequence[Problem], params: Sequence[Any], seeds: Sequence[int]) -> list[SampledEpisode]:
        """One episode per problem; ``params[i].max_tokens`` is episode ``i``'s whole budget."""
        envs = [self.environment() for _ in problems]
        episodes = [Episode(env.reset(p)) for env, p in zip(envs, problems, strict=True)]
        for i, (e, p) in enumerate(zip(episodes, params, strict=True)):
            if e.prompt.size + p.max_tokens > self.engine.max_seq_len:
                raise UsageError(f"episode {i}: a prompt of {e.prompt.size} ids and sampling.max_tokens "
                                 f"{p.max_tokens} exceed the engine's max_seq_len {self.engine.max_seq_len}")
        used = [0] * len(problems)

        def then(i: int, turn: Any) -> Continuation | None:
            sampled = np.asarray(turn.tokens, np.int32)
            used[i] += sampled.size
            result = envs[i].step(sampled)
            appended = within_budget(result.ids, params[i].max_tokens - used[i])
            used[i] += appended.size
            episodes[i] = episodes[i].add(Turn(sampled, np.asarray(turn.logprobs, np.float32), appended, result.call))
            if result.kind is not StepKind.TOOL_RESULT or used[i] >= params[i].max_tokens:
                return None
            k = len(episodes[i].turns)
            if k >= MAX_TURNS:
                raise EpisodeError(f"episode {i} did not end within {MAX_TURNS} turns")
            return Continuation(appended, self._turn(params[i], used[i]), turn_seed(int(seeds[i]), k))

        self.engine.generate([e.prompt for e in episodes], [self._turn(p, 0) for p in params],
                             [turn_seed(int(s), 0) for s in seeds], then=then)
        return [recorded(e, p.max_tokens) for e, p in zip(episodes, params, strict=True)]

    def _turn(self, params: Any, used: int) -> Any:
        """A turn's sampling params: at most ``turn_tokens`` of what is left of the episode's budget."""
        return dataclasses.replace(params, max_tokens=min(self.turn_tokens, params.max_tokens - used))


def rederive(env: ToolEnvironment, problem: Problem, prompt: np.ndarray, tokens: np.ndarray, logprobs: np.ndarray,
             turns: Sequence[Mapping[str, Any]], max_tokens: int) -> Episode:
    """Re-derive a recorded episode (a ``RolloutCompleted``'s prompt, tokens, log-probs and turns)
    from its sampled ids with the recorded tool results and the episode's budget
    (``replay_episode``: no tool runs); ``EpisodeDivergence`` names the turn that differs."""
    return replay_episode(env, problem, episode_of(prompt, tokens, logprobs, turns), max_tokens=max_tokens)


__all__ = ["EpisodeSampler", "SampledEpisode", "call_of", "call_record", "completion_mask", "episode_of",
           "final_ids", "recorded", "rederive", "spans", "turns_problem"]
