"""A task whose problems are answered with tools: another task's problems, with the tools' syntax
in the prompt, scored by that task.

``ToolTask(inner, rule, tools)`` keeps the inner task's problems, splits and scoring, and tells
the model how to call each tool: in a system message under a chat template (SmolLM2-Instruct's,
for instance), or in front of the prompt's text for a model without one (the built-in character
model, whose alphabet is lowercase: the plain instructions are written in it).
``tool_environment`` builds the environment of such a task for a model's codec.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

import numpy as np

from runtime.episodes.calculator import Calculator
from runtime.episodes.environment import ToolEnvironment
from runtime.episodes.parsing import Rule, TagRule
from runtime.episodes.tools import Tool
from runtime.episodes.turns import turn_format
from runtime.errors import UsageError
from runtime.tasks.base import Problem, Task, TextCodec, scan_prompt_tokens
from runtime.tasks.gym import GymTask
from verifiers.outcome import Outcome

EXAMPLES = {"calculator": "12*7+5", "python": "print(12*7+5)"}
_EXPRESSION = re.compile(r"[-(]*\d[\d+\-*/(). ]*[\d)]")
"""An arithmetic expression in a question's text (the longest one is what a demonstration calls)."""


def instructions(rule: Rule, tools: Sequence[str], *, chat: bool, answer_hint: str) -> str:
    """The text that tells the model how to call ``tools`` with ``rule`` and how to answer."""
    calls = " or ".join(rule.syntax(t, EXAMPLES.get(t, "...")) for t in tools)
    if chat:
        return (f"You can use tools: {', '.join(tools)}. To call one, write {calls} and stop; its result "
                f"comes back in the next message. {answer_hint}")
    return f"tools: {calls}\n"


class ToolTask(Task):
    """The problems of ``inner`` answered with ``tools`` (by name) called by ``rule``.

    Args:
      inner: the task whose problems and scoring are used.
      rule: the tool-call rule the prompt teaches.
      tools: the tool names the prompt lists.
      chat: the prompt goes to a chat template (a system message) rather than a plain codec.
      answer_hint: how the final answer is to be written (chat prompts only); default: the
        ``<answer>`` tag for a reasoning-gym task that reads it, else the answer alone.
      max_calls: tool calls an episode may make (``ToolEnvironment``).
      turn_tokens: most ids the model samples in one turn.
    """

    multi_turn = True

    def __init__(self, inner: Task, rule: Rule, tools: Sequence[str], *, chat: bool, answer_hint: str | None = None,
                 max_calls: int = 4, turn_tokens: int = 32):
        self.inner, self.rule, self.tools, self.chat = inner, rule, tuple(tools), chat
        self.max_calls, self.turn_tokens = max_calls, turn_tokens
        self.name = f"tools:{inner.name}"
        self.package, self.version = inner.package, inner.version
        self.max_tokens = max(inner.max_tokens, 64)
        if answer_hint is None:
            tagged = isinstance(inner, GymTask) and inner.answer_rule == "tag"
            answer_hint = ("When you know the answer, write it as <answer>...</answer>." if tagged
                           else "When you know the answer, write only the answer.")
        self.text = instructions(rule, self.tools, chat=chat, answer_hint=answer_hint)

    @property
    def train_size(self) -> int:
        return self.inner.train_size

    @property
    def eval_size(self) -> int:
        return self.inner.eval_size

    def max_prompt_chars(self) -> int:
        return self.inner.max_prompt_chars() + len(self.text)

    def max_prompt_tokens(self, codec: TextCodec, *, limit: int, why: str) -> int:
        """As ``Task.max_prompt_tokens`` for the prompts with the instructions, after the inner
        task's own checks (a reasoning-gym system message needs a template, a character
        tokenizer must have the questions' characters) and a check that a character tokenizer
        has every character of the instructions."""
        self.inner.max_prompt_tokens(codec, limit=limit, why=why)
        if codec.char_level:
            unknown = "".join(sorted({c for c in self.text if codec.tokenizer.token_to_id(c) is None}))
            if unknown:
                raise UsageError(f"task {self.name!r}: the tool instructions use characters the model's tokenizer "
                                 f"does not have ({unknown!r}); use the tag rule (<tool>NAME: ...</tool>)")
            return self.max_prompt_chars() + (codec.bos_id is not None)
        return scan_prompt_tokens(self, codec, limit=limit, why=why)

    def describe(self) -> dict:
        return {"name": self.name, "inner": self.inner.describe(), "rule": self.rule.describe(), "tools": list(self.tools),
                "chat": self.chat, "instructions": self.text, "max_calls": self.max_calls,
                "demonstration": 1}

    @property
    def has_code(self) -> bool:
        return self.inner.has_code

    def supervised_indices(self):
        return self.inner.supervised_indices()

    @property
    def code_verifier(self):
        """The run's code verifier: the inner task's (its code tests) and the Python tool's sandbox."""
        return self.inner.code_verifier

    @code_verifier.setter
    def code_verifier(self, verifier) -> None:
        self.inner.code_verifier = verifier

    def live_tools(self) -> dict[str, Tool]:
        """The tools, by name, as they run: the Python tool in the run's code sandbox (the one
        ``verifier.isolation`` settled), else in the process-wide default one."""
        from runtime.episodes.python_tool import PythonTool

        verifier = self.inner.code_verifier
        made: dict[str, Tool] = {"calculator": Calculator(),
                                 "python": PythonTool(None if verifier is None else verifier.sandbox)}
        return {name: made[name] for name in self.tools}

    def environment(self, codec: TextCodec, tools: Mapping[str, Tool] | None = None, *, score: bool = False) -> ToolEnvironment:
        """An environment of this task's problems for a model whose text is ``codec``, with the
        live tools (or ``tools``); ``score``: it scores final answers itself (a run's verifier
        does, so by default it does not)."""
        return ToolEnvironment(self, turn_format(codec), self.rule, self.live_tools() if tools is None else tools,
                               max_calls=self.max_calls, score=score)

    def demonstration(self, index: int, codec: TextCodec) -> tuple[np.ndarray, np.ndarray] | None:
        """A worked episode of training problem ``index`` for the supervised warm start: the model
        calls the calculator with the longest arithmetic expression of the question, the result is
        appended as the environment appends it, and the model writes the target. ``(ids, mask)``
        with ``mask`` True on the model's ids; None when the question holds no expression, the
        problem has no target or no calculator is listed."""
        inner = self.inner.problem("train", index)
        question = inner.messages[-1][1] if inner.messages else inner.prompt
        found = _EXPRESSION.findall(question)
        problem = self.problem("train", index)
        if "calculator" not in self.tools or not found or problem.target is None:
            return None
        expression = max(found, key=len).strip()
        env = self.environment(codec, {"calculator": Calculator()})
        prompt = env.reset(problem)
        call = np.asarray([*codec.tokenizer.encode(self.rule.syntax("calculator", expression),
                                                   add_special_tokens=False).ids, codec.eos_ids[0]], np.int32)
        result = env.step(call)
        answer = np.asarray(codec.target_ids(problem), np.int32)
        ids = np.concatenate([prompt, call, result.ids, answer])
        mask = np.concatenate([np.zeros(prompt.size, bool), np.ones(call.size, bool), np.zeros(result.ids.size, bool),
                               np.ones(answer.size, bool)])
        return ids, mask

    def problem(self, split: str, index: int) -> Problem:
        p = self.inner.problem(split, index)
        if not self.chat:
            return dataclasses.replace(p, prompt=self.text + p.prompt)
        messages = list(p.messages or (("user", p.prompt),))
        if messages[0][0] == "system":
            messages[0] = ("system", messages[0][1] + "\n\n" + self.text)
        else:
            messages.insert(0, ("system", self.text))
        return dataclasses.replace(p, messages=tuple(messages))

    def score(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Outcome]:
        return self.inner.score(problems, completions)

    def reward(self, outcome: Outcome) -> float:
        return self.inner.reward(outcome)


def tool_environment(inner: Task, codec: TextCodec, tools: Mapping[str, Tool] | None = None, *,
                     rule: Rule | None = None, max_calls: int = 4) -> ToolEnvironment:
    """The environment of ``inner``'s problems with ``tools`` (default: a calculator) for a model
    whose text is ``codec``: chat turns under its template, plain turns without one."""
    chosen: dict[str, Tool] = dict(tools) if tools is not None else {"calculator": Calculator()}
    read: Rule = rule if rule is not None else TagRule()
    task = ToolTask(inner, read, tuple(chosen), chat=codec.template is not None)
    return ToolEnvironment(task, turn_format(codec), read, chosen, max_calls=max_calls)
