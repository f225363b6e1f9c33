"""An episode as a plain, exact record (JSON-safe) and back: for committed histories and audits.

Ids are lists of integers; log-probs are the float32 little-endian bytes in hex, so no float is
ever re-printed as text; a tool's output bytes are in hex too. The record names the tool-call
rule and its digest: ``episode_from_record`` refuses a record read with another rule, since the
same ids would be read as other calls. (The ledger's events will carry the same fields in its
own msgpack codec.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.episodes.episode import Episode, EpisodeError, Turn
from runtime.episodes.parsing import Rule, rule_digest
from runtime.episodes.tools import Status, ToolCall, ToolResult

RECORD_VERSION = 1


def _result(result: ToolResult) -> dict[str, Any]:
    return {"output": result.output.hex(), "exit_status": result.exit_status, "wall_s": result.wall_s,
            "truncated": result.truncated, "status": result.status.value, "detail": result.detail}


def episode_record(episode: Episode, rule: Rule) -> dict[str, Any]:
    """``episode`` as a JSON-safe record, with the ``rule`` its calls were read with."""
    turns = []
    for turn in episode.turns:
        entry: dict[str, Any] = {"sampled": turn.sampled.tolist(), "logprobs": turn.logprobs.astype("<f4").tobytes().hex(),
                                 "appended": turn.appended.tolist()}
        if turn.call is not None:
            entry["call"] = {"tool": turn.call.tool, "arguments": turn.call.arguments, "result": _result(turn.call.result)}
        turns.append(entry)
    return {"version": RECORD_VERSION, "rule": rule.name, "rule_digest": rule_digest(rule),
            "prompt": episode.prompt.tolist(), "turns": turns, "reward": episode.reward}


def episode_from_record(record: dict[str, Any], rule: Rule) -> Episode:
    """The episode of ``record``; ``EpisodeError`` if it is of another version or another rule."""
    if record.get("version") != RECORD_VERSION:
        raise EpisodeError(f"episode record version {record.get('version')!r} is not accepted; accepted: {RECORD_VERSION}")
    if record.get("rule_digest") != rule_digest(rule):
        raise EpisodeError(f"the episode was recorded with tool-call rule {record.get('rule')!r} "
                           f"({str(record.get('rule_digest'))[:12]}), not {rule.name!r} ({rule_digest(rule)[:12]})")
    turns = []
    for entry in record["turns"]:
        call = None
        if "call" in entry:
            c, r = entry["call"], entry["call"]["result"]
            call = ToolCall(c["tool"], c["arguments"], ToolResult(bytes.fromhex(r["output"]), r["exit_status"],
                                                                  float(r["wall_s"]), bool(r["truncated"]),
                                                                  Status(r["status"]), r["detail"]))
        logprobs = np.frombuffer(bytes.fromhex(entry["logprobs"]), "<f4").astype(np.float32)
        turns.append(Turn(entry["sampled"], logprobs, entry["appended"], call))
    reward = record["reward"]
    return Episode(record["prompt"], tuple(turns), None if reward is None else float(reward))
