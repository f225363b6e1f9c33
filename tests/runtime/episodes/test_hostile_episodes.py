"""Hostile tool use inside sampled episodes: a call that forks, loops, writes a gigabyte or prints
100 MB is cut by the Python tool's limits, recorded as such in the episode's turns, and the
episode goes on to the model's next turn; the recorded completion is one a run admits."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from ledger import events as ev
from runtime.controller.admit import Bounds, completion_values
from runtime.episodes import Parsed, PlainTurns, PythonTool, Status, TagRule, ToolEnvironment, ToolTask
from runtime.episodes.rollout import EpisodeSampler, rederive
from runtime.inference import Engine, SamplingParams
from runtime.model import Model, ModelConfig
from runtime.tasks import Arithmetic
from verifiers.code import Limits

FAST = Limits(wall_s=3.0, cpu_s=1.0, output_bytes=1 << 20, processes=16, file_bytes=4 << 20)
MAX_TOKENS = 1200  # room for a cut result (1 KiB of output and the line naming the limit) and an answer

HOSTILE = {
    "fork": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
             Status.TIME_LIMIT),
    "loop": ("while True:\n    pass\n", Status.TIME_LIMIT),
    "gigabyte": ("with open('big', 'wb') as f:\n    for _ in range(1024):\n        f.write(b'0' * (1 << 20))\n",
                 Status.ERROR),
    "print_100mb": ("import sys\nfor _ in range(100):\n    sys.stdout.write('x' * (1 << 20))\n", Status.OUTPUT_LIMIT),
}


@dataclasses.dataclass(frozen=True)
class Runs(TagRule):
    """Reads an untrained model's first action as a call of the Python tool with ``code``; its
    later actions are final answers (so each episode makes one hostile call, then goes on)."""

    code: str = ""
    name: str = "runs"

    def parse(self, text: str) -> Parsed:
        return Parsed(True, "python", self.code)


@pytest.fixture(scope="module")
def engine(plain_codec):
    config = ModelConfig(vocab_size=plain_codec.tokenizer.get_vocab_size(), hidden_size=32, num_layers=1, num_heads=2,
                         num_kv_heads=1, intermediate_size=64, max_position_embeddings=1280, eos_token_id=2)
    model = Model.init(config, key=jax.random.key(3))
    return Engine(model, max_slots=2, page_size=16, num_pages=2 * 80 + 1, max_seq_len=1280,
                  prefill_buckets=(64, 256, 1279))


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_call_is_cut_recorded_and_the_episode_goes_on(plain_codec, engine, sandbox, name):
    code, status = HOSTILE[name]
    task = ToolTask(Arithmetic(digits=1, eval_size=10), TagRule(), ("python",), chat=False, max_calls=1)

    def environment() -> ToolEnvironment:
        return ToolEnvironment(task, PlainTurns(plain_codec), Runs(code=code), {"python": PythonTool(sandbox, FAST)},
                               max_calls=1, score=False)

    problems = [task.problem("train", i) for i in range(2)]
    params = [SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, stop_token_ids=plain_codec.eos_ids)] * 2
    episodes = EpisodeSampler(engine, environment, turn_tokens=6).generate(problems, params, [11, 12])
    for problem, e in zip(problems, episodes, strict=True):
        call = e.turns[0]["call"]
        assert call["tool"] == "python" and call["status"] == status.value, call
        assert len(call["output"]) <= 1024 and call["detail"]
        assert len(e.turns) == 2 and e.turns[1]["call"] is None  # the episode went on to an answer
        completion = ev.RolloutCompleted(0, "w", 0, 0, "d" * 64, e.tokens, e.logprobs, e.finish_reason, e.turns)
        assert completion_values(completion, Bounds(plain_codec.tokenizer.get_vocab_size(), MAX_TOKENS, True)) is None
        # the appended ids say what cut the call, and a replay re-derives them from the record alone
        appended = e.tokens[e.turns[0]["sampled"]: e.turns[0]["sampled"] + e.turns[0]["appended"]]
        assert "error:" in plain_codec.tokenizer.decode(appended.tolist())
        replayed = rederive(environment(), problem, plain_codec.encode_prompt(problem), e.tokens, e.logprobs, e.turns,
                            MAX_TOKENS)
        assert np.array_equal(replayed.row().ids[replayed.prompt.size:], e.tokens)
