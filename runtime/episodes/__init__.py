"""Multi-turn, tool-using episodes: token in, token out (issue 36's foundation).

An *episode* is one rollout over several turns. The environment (``environment``) gives the first
observation's ids (``reset``); each turn the model samples ids, and ``step`` reads a tool call from
their decoded text with a named, digested rule (``parsing``), runs the tool (``calculator``,
``python_tool`` in the code verifier's sandbox, under its limits) and returns the ids to append: the
tool's result wrapped in the chat template's role markers, produced with the model's own tokenizer
(``turns``). The model's sampled ids are never re-tokenized, so the training row
(``Episode.row()``) is exactly the concatenation of the recorded ids, with a mask that is True on
the model's own tokens only. Every call's result (bytes, exit status, time, truncation) is
recorded, so ``replay`` re-derives an episode with no tool run, and ``check_tools`` names a tool
that does not give the recorded result again. ``task`` puts another task's problems behind tools
(reasoning-gym arithmetic or the built-in sums, with a calculator), for a checkpoint with a chat
template and for the built-in character model.

What remains to wire (later work on the issue): the controller leases one episode per rollout
(one lease for all its turns, re-issued whole after a kill); the engine continues an episode from
its ids so far, keeping its KV pages between turns where the pool allows (``Episode.context()``
is what it continues from; ``run_episode`` is the loop, and ``EnginePolicy`` already drives the
engine from those ids, prefilling each turn again until pages are kept); ledger
events for every turn's sampled ids and every call's result, with the rule's name and digest
(``ToolEnvironment.describe()``) in the run's config; ``rlx replay`` driving ``replay_episode``
(and ``--regenerate`` driving ``check_tools``); ``rlx audit rollout`` showing turns;
``scripts/bench_multiturn.py``.
"""

from runtime.episodes.calculator import CalcError, Calculator
from runtime.episodes.environment import (
    Environment,
    LiveTools,
    Policy,
    StepKind,
    StepResult,
    ToolEnvironment,
    ToolRunner,
    run_episode,
)
from runtime.episodes.episode import Episode, EpisodeError, Row, Turn
from runtime.episodes.parsing import RULES, FenceRule, Parsed, Rule, TagRule, make_rule, rule_digest
from runtime.episodes.python_tool import TOOL_LIMITS, PythonTool
from runtime.episodes.record import RECORD_VERSION, episode_from_record, episode_record
from runtime.episodes.replay import (
    EpisodeDivergence,
    RecordedTools,
    ToolDivergence,
    check_tools,
    replay_environment,
    replay_episode,
)
from runtime.episodes.sampling import EPISODE_TURN, EnginePolicy, turn_seed
from runtime.episodes.task import ToolTask, instructions, tool_environment
from runtime.episodes.tools import MAX_RESULT_BYTES, Status, Tool, ToolCall, ToolResult
from runtime.episodes.turns import ChatTurns, PlainTurns, TurnFormat, turn_format

__all__ = [
    "CalcError", "Calculator", "EPISODE_TURN", "EnginePolicy", "RECORD_VERSION", "episode_from_record",
    "episode_record", "ChatTurns", "Environment", "Episode", "EpisodeDivergence", "EpisodeError",
    "FenceRule", "LiveTools", "MAX_RESULT_BYTES", "Parsed", "PlainTurns", "Policy", "PythonTool", "RULES",
    "RecordedTools", "Row", "Rule", "Status", "StepKind", "StepResult", "TOOL_LIMITS", "TagRule", "Tool",
    "ToolCall", "ToolDivergence", "ToolEnvironment", "ToolResult", "ToolRunner", "ToolTask", "Turn",
    "TurnFormat", "check_tools", "instructions", "make_rule", "replay_environment", "replay_episode",
    "rule_digest", "run_episode", "tool_environment", "turn_format", "turn_seed",
]
