"""The tool task: another task's problems with the tool syntax in the prompt, for a checkpoint's
chat template and for the built-in character model, scored by the inner task."""

from __future__ import annotations

import pytest

from runtime.episodes import FenceRule, TagRule, ToolTask, replay_episode, run_episode, tool_environment
from runtime.errors import UsageError
from runtime.tasks import Arithmetic, make_task
from tests.runtime.episodes.scripted import Scripted

SYSTEM_HINT = "To call one, write <tool>calculator: 12*7+5</tool> and stop"


@pytest.fixture(scope="module")
def gym_sums():
    return make_task("gym:basic_arithmetic", seed=0, options={"train_size": 50, "eval_size": 5})


def test_plain_prompts_teach_the_syntax_in_the_models_alphabet(plain_codec):
    task = ToolTask(Arithmetic(), TagRule(), ("calculator",), chat=False)
    problem = task.problem("eval", 0)
    assert problem.prompt == "tools: <tool>calculator: 12*7+5</tool>\n" + Arithmetic().problem("eval", 0).prompt
    assert (task.train_size, task.eval_size) == (Arithmetic().train_size, Arithmetic().eval_size)
    assert task.max_prompt_chars() == Arithmetic().max_prompt_chars() + len(task.text)
    unk = plain_codec.tokenizer.token_to_id("<unk>")
    assert unk not in plain_codec.encode_prompt(problem).tolist()
    assert task.describe()["rule"]["rule"] == "tag"


def test_chat_prompts_put_the_syntax_in_a_system_message(gym_sums):
    task = ToolTask(gym_sums, TagRule(), ("calculator",), chat=True)
    problem = task.problem("train", 0)
    (role, system), (user_role, question) = problem.messages
    assert role == "system" and SYSTEM_HINT in system and "<answer>...</answer>" in system
    assert (user_role, question) == ("user", gym_sums.problem("train", 0).prompt)
    with_system = make_task("gym:basic_arithmetic", seed=0,
                            options={"train_size": 50, "eval_size": 5, "system": "Be brief."})
    merged = ToolTask(with_system, TagRule(), ("calculator",), chat=True).problem("train", 0).messages
    assert merged[0][0] == "system" and merged[0][1].startswith("Be brief.\n\n") and SYSTEM_HINT in merged[0][1]
    assert len(merged) == 2


def _solve(codec, inner, index):
    env = tool_environment(inner, codec)
    problem = env.task.problem("train", index)
    expression = inner.problem("train", index).prompt.removeprefix("Calculate ").rstrip(".")
    answer = str(inner.problem("train", index).answer)
    texts = [f"<tool>calculator: {expression}</tool>", f"<answer>{answer}</answer>"]
    episode = run_episode(env, problem, Scripted(codec, texts))
    return env, problem, episode, answer


def test_a_gym_arithmetic_episode_with_smollm2(smollm2_codec, gym_sums):
    env, problem, episode, answer = _solve(smollm2_codec, gym_sums, 0)
    assert episode.calls[0].result.output.decode() == answer  # the calculator agrees with the dataset
    assert episode.reward == 1.0
    assert replay_episode(env, problem, episode) == episode
    prompt = smollm2_codec.tokenizer.decode(episode.prompt.tolist(), skip_special_tokens=False)
    assert prompt.startswith("<|im_start|>system\nYou can use tools: calculator.")
    assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_a_gym_arithmetic_episode_with_a_chat_template(chat_codec, gym_sums):
    env, problem, episode, answer = _solve(chat_codec, gym_sums, 1)
    assert episode.calls[0].result.output.decode() == answer and episode.reward == 1.0


def test_a_sums_episode_with_the_character_model(plain_codec):
    inner = Arithmetic(digits=3, eval_size=20)
    env = tool_environment(inner, plain_codec)
    p = inner.problem("eval", 3)
    episode = run_episode(env, env.task.problem("eval", 3),
                          Scripted(plain_codec, [f"<tool>calculator: {p.prompt.rstrip('=')}</tool>", str(p.answer)]))
    assert episode.calls[0].result.output == str(p.answer).encode() and episode.reward == 1.0


def test_prompt_lengths_include_the_instructions_and_their_characters_are_checked(plain_codec, smollm2_codec, gym_sums):
    task = ToolTask(Arithmetic(digits=2, eval_size=10), TagRule(), ("calculator",), chat=False)
    longest = task.max_prompt_tokens(plain_codec, limit=512, why="test")
    assert longest == len(task.text) + 6 + 1  # instructions, "12+35=", <bos>
    fenced = ToolTask(Arithmetic(digits=2, eval_size=10), FenceRule(), ("python",), chat=False)
    with pytest.raises(UsageError, match="does not have \\('`'\\); use the tag rule"):
        fenced.max_prompt_tokens(plain_codec, limit=512, why="test")
    chat = ToolTask(gym_sums, TagRule(), ("calculator",), chat=True)
    encoded = max(smollm2_codec.encode_prompt(chat.problem(split, i)).size
                  for split, size in (("train", 50), ("eval", 5)) for i in range(size))
    assert chat.max_prompt_tokens(smollm2_codec, limit=4096, why="test") == encoded
    with pytest.raises(UsageError, match="more than the 20 a prompt may have"):
        chat.max_prompt_tokens(smollm2_codec, limit=20, why="test")


def test_a_run_with_the_python_tool_settles_its_sandbox_first_and_the_tool_runs_in_it():
    from runtime.config import load_config
    from runtime.session import build_task

    config = load_config(None, ['episodes.tools=["calculator", "python"]', 'verifier.isolation="auto"'])
    task, sandbox = build_task(config, log=lambda m: None)
    assert sandbox is not None and task.code_verifier is not None  # settled before anything is trained
    tools = task.live_tools()
    assert sorted(tools) == ["calculator", "python"] and tools["python"].sandbox is task.code_verifier.sandbox
    assert tools["python"].run("print(6 * 7)\n").output == b"42\n"
