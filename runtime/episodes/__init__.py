"""Multi-turn, tool-using episodes: token in, token out (issue 36's foundation).

An *episode* is one rollout over several turns. The environment (``environment``) gives the first
observation's ids (``reset``); each turn the model samples ids, and ``step`` reads a tool call from
their decoded text with a named, digested rule (``parsing``), runs the tool (``calculator``,
``python_tool`` in the code verifier's sandbox, under its limits) and returns the ids to append: the
tool's result wrapped in the chat template's own role markers, produced with the model's tokenizer
(``turns``; the result's text is encoded literally, so it cannot forge a marker). The model's
sampled ids are never re-tokenized, so the training row (``Episode.row()``) is exactly the
concatenation of the recorded ids, with a mask that is True on the model's own tokens only. Every
call's result (bytes, exit status, time, truncation) is recorded (``record``: an exact JSON-safe
form), so ``replay`` re-derives an episode with no tool run, and ``check_tools`` names a tool that
does not give the recorded result again. ``task`` puts another task's problems behind tools
(reasoning-gym arithmetic or the built-in sums, with a calculator), for a checkpoint with a chat
template and for the built-in character model. ``sampling.EnginePolicy`` drives the engine from
an episode's ids, one seed per turn (``turn_seed``: purpose ``episode.turn`` of ``runtime.rng``'s
derivation, to be listed there when the controller uses it).

In a run (``episodes.tools``): ``rollout.EpisodeSampler`` samples a batch of leases' episodes
in one engine call, each episode a request that goes on after every turn on the KV pages it holds
(the engine feeds the appended ids through its decode step; everything after the prompt is always
decode-written, so a preempted episode, ``EnginePolicy`` and a replay get the same bits), and
``RolloutCompleted`` records them (``tokens``: every id after the prompt; ``turns``: per turn the
ids sampled and appended and the call's record); the trainer masks in the sampled ids only
(``rollout.completion_mask``), the verifier scores the last turn (``rollout.final_ids``), a
``ToolTask``'s warm start trains on worked episodes (``ToolTask.demonstration``), ``rlx replay``
re-derives every trained episode from the recorded results (``rollout.rederive``), and
``check.check_rows`` compares every trained row with its record.
SmolLM2-135M-Instruct wrote no tool call in 12 tries with these prompts (basic_arithmetic): RL on
the tool task wants a warm start on worked episodes first (``rlx pretrain`` with ``episodes.tools``).
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
from runtime.episodes.sampling import EnginePolicy, turn_seed
from runtime.episodes.task import ToolTask, instructions, tool_environment
from runtime.episodes.tools import MAX_RESULT_BYTES, Status, Tool, ToolCall, ToolResult
from runtime.episodes.turns import ChatTurns, PlainTurns, TurnFormat, turn_format

__all__ = [
    "CalcError", "Calculator", "EnginePolicy", "RECORD_VERSION", "episode_from_record",
    "episode_record", "ChatTurns", "Environment", "Episode", "EpisodeDivergence", "EpisodeError",
    "FenceRule", "LiveTools", "MAX_RESULT_BYTES", "Parsed", "PlainTurns", "Policy", "PythonTool", "RULES",
    "RecordedTools", "Row", "Rule", "Status", "StepKind", "StepResult", "TOOL_LIMITS", "TagRule", "Tool",
    "ToolCall", "ToolDivergence", "ToolEnvironment", "ToolResult", "ToolRunner", "ToolTask", "Turn",
    "TurnFormat", "check_tools", "instructions", "make_rule", "replay_environment", "replay_episode",
    "rule_digest", "run_episode", "tool_environment", "turn_format", "turn_seed",
]
