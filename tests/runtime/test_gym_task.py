"""reasoning-gym datasets as tasks (``data.task = "gym:<dataset>"``): seeded, with a real held-out
split, scored by each dataset's own ``score_answer``, their version recorded and checked."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from runtime.config import load_config, task_max_tokens
from runtime.errors import UsageError
from runtime.tasks import make_task
from runtime.tasks.base import TextCodec
from runtime.tasks.gym import GymTask, extract_answer, installed_version

pytest.importorskip("reasoning_gym")

SMALL = {"train_size": 2000, "eval_size": 50}
# Two one-digit terms: 10 * 10 * 2 = 200 distinct questions, so held-out questions recur among
# the training draws and the skip rule is exercised.
TINY_SPACE = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def gym(dataset: str = "chain_sum", seed: int = 1, **options) -> GymTask:
    task = make_task(f"gym:{dataset}", seed=seed, options={**SMALL, **options})
    assert isinstance(task, GymTask)
    return task


def one_line(e: pytest.ExceptionInfo) -> str:
    message = str(e.value)
    assert "\n" not in message, message
    return message


def test_the_same_seed_gives_the_same_problems_and_another_seed_others():
    a, b, c = gym(seed=1), gym(seed=1), gym(seed=2)
    for split in ("train", "eval"):
        assert [a.problem(split, i) for i in range(40)] == [b.problem(split, i) for i in range(40)]
        assert [a.problem(split, i).prompt for i in range(40)] != [c.problem(split, i).prompt for i in range(40)]
    assert [a.problem("train", i).prompt for i in range(40)] != [a.problem("eval", i).prompt for i in range(40)]
    p = a.problem("train", 7)
    assert p.answer == p.target and p.answer is not None and p.prompt.startswith("State the final answer")
    assert (a.train_size, a.eval_size) == (2000, 50)
    assert a.describe() == {"name": "gym:chain_sum", "options": SMALL, "train_size": 2000, "eval_size": 50,
                            "seed": 1, "version": installed_version()}
    assert make_task("gym:chain_sum").train_size == 100_000 and make_task("gym:chain_sum").eval_size == 500


def test_held_out_questions_are_never_trained_on():
    task = gym(**TINY_SPACE)
    held = {task.problem("eval", i).prompt for i in range(task.eval_size)}
    train = [task.problem("train", i) for i in range(task.train_size)]
    assert not held & {p.prompt for p in train}
    redrawn = [p for p in train if p.draw > 0]  # their first draw was a held-out question
    assert 0.05 * len(train) < len(redrawn) < 0.5 * len(train)
    again = gym(**TINY_SPACE)
    assert [p.draw for p in train[:300]] == [again.problem("train", i).draw for i in range(300)]


def test_a_dataset_too_small_for_its_held_out_split_is_refused_when_counted():
    task = gym(**TINY_SPACE, eval_size=2000)  # the held-out draws cover (nearly) every question
    with pytest.raises(UsageError, match="too few distinct questions to hold out 2000") as e:
        task.max_prompt_chars()
    assert "data.options.eval_size" in one_line(e)


def test_answers_are_scored_by_the_datasets_own_score_answer():
    task = gym()
    p = task.problem("train", 3)
    assert p.answer is not None
    right, tagged, wrong, partial, empty = task.score(
        [p] * 5, [p.answer, f"thinking... <answer>0</answer> no: <answer> {p.answer} </answer>", "none",
                  f"is {p.answer}", "<answer> </answer>"])
    assert (right.verdict, right.passed, task.reward(right)) == ("AC", True, 1.0)
    assert (right.verifier, right.version) == ("gym:chain_sum", installed_version())
    assert (tagged.verdict, task.reward(tagged)) == ("AC", 1.0)
    assert (wrong.verdict, task.reward(wrong)) == ("WA", 0.0)
    # chain_sum's score_answer: an answer that contains the oracle's earns len(oracle) / len(answer)
    assert partial.verdict == "WA" and task.reward(partial) == len(p.answer) / len(f"is {p.answer}")
    assert partial.reward == task.reward(partial)  # the outcome carries its score
    assert (empty.verdict, task.reward(empty)) == ("PARSE_ERROR", 0.0)
    held = task.problem("eval", 0)
    assert held.answer is not None and task.score([held], [held.answer])[0].passed


def test_answer_extraction():
    assert extract_answer("  42 \n") == "42"
    assert extract_answer("a <answer>1</answer> b <answer>\n2\n</answer> c") == "2"
    assert extract_answer("<answer>unclosed") == "<answer>unclosed"
    assert extract_answer("The answer is -12.5, not 3.", "last_number") == "3"
    assert extract_answer("4 + 5 = +9.", "last_number") == "9"
    assert extract_answer("9 <answer>it is -4</answer> 7", "last_number") == "-4"
    assert extract_answer("no digits", "last_number") == ""


def test_the_last_number_rule_scores_a_sentence_by_its_number():
    task = gym(answer="last_number")
    p = task.problem("train", 3)
    right, wrong, none = task.score([p] * 3, [f"The final answer is {p.answer}.", "It is 123456789.", "I do not know"])
    assert (right.verdict, task.reward(right)) == ("AC", 1.0)
    assert (wrong.verdict, task.reward(wrong)) == ("WA", 0.0)
    assert (none.verdict, task.reward(none)) == ("PARSE_ERROR", 0.0)


def test_data_options_come_from_set_and_the_version_is_recorded_and_checked():
    from runtime.session import make_task as session_task
    from runtime.session import resolve

    config = load_config(None, ["data.task=gym:chain_sum", "data.options={min_terms=2,max_terms=2,eval_size=20}",
                                "data.options.train_size=300"])
    assert config.data.options == {"min_terms": 2, "max_terms": 2, "eval_size": 20, "train_size": 300}
    assert config.max_tokens == task_max_tokens("gym:chain_sum") == GymTask.max_tokens
    task = session_task(config)
    assert (task.train_size, task.eval_size) == (300, 20)
    assert all(p.prompt.count("+") + p.prompt.count("-") == 1 for p in map(task.problem, ["train"] * 50, range(50)))
    resolved = resolve(config, task)
    assert resolved.data.task_version == installed_version() and resolved.data.size == 300
    assert resolved.to_dict()["data"]["task_version"] == installed_version()
    assert session_task(resolved).problem("train", 5) == task.problem("train", 5)
    other = dataclasses.replace(resolved, data=dataclasses.replace(resolved.data, task_version="0.0.1"))
    with pytest.raises(UsageError) as e:
        session_task(other)
    assert f"reasoning-gym 0.0.1 (data.task_version) but {installed_version()} is installed" in one_line(e)


def test_a_config_logged_before_the_fields_existed_still_reads():
    from runtime.config import Config

    logged = load_config(None, []).to_dict()
    for field in ("options", "task_version"):
        del logged["data"][field]
    config = Config.from_dict(logged)
    assert (config.data.options, config.data.task_version) == ({}, None)


@pytest.mark.parametrize("task, options, message", [
    ("gym:nope", {}, "reasoning-gym has no dataset 'nope'; accepted: gym:<dataset> for a dataset of"),
    ("gym:", {}, "unknown task 'gym:'; accepted: arithmetic, codefn, jsonl, gym:<name>"),
    ("nope:chain_sum", {}, "unknown task 'nope:chain_sum'"),
    ("gym:chain_sum", {"min_term": 2}, "data.options.min_term is not an option of reasoning-gym dataset 'chain_sum'; "
                                       "accepted: min_terms, max_terms"),
    ("gym:chain_sum", {"min_terms": 3, "max_terms": 2}, "are not accepted by reasoning-gym dataset 'chain_sum': "
                                                        "AssertionError: max_terms must be >= min_terms"),
    ("gym:chain_sum", {"min_terms": "two"}, "are not accepted by reasoning-gym dataset 'chain_sum': TypeError"),
    ("gym:chain_sum", {"seed": 3}, "data.options.seed is not accepted: the generators' seeds come from run.seed"),
    ("gym:chain_sum", {"train_size": 0}, "data.options.train_size 0 is not accepted; it must be an integer in 1.."),
    ("gym:chain_sum", {"eval_size": True}, "data.options.eval_size True is not accepted"),
    ("gym:chain_sum", {"system": ""}, "data.options.system '' is not accepted"),
    ("gym:chain_sum", {"answer": "last"}, "data.options.answer 'last' is not accepted; accepted: tag, last_number"),
])
def test_bad_dataset_names_and_options_are_refused_in_one_line(task, options, message):
    with pytest.raises(UsageError) as e:
        make_task(task, options=options)
    assert message in one_line(e)


@pytest.mark.parametrize("sets, message", [
    (["data.task=gym:nope"], "reasoning-gym has no dataset 'nope'"),
    (["data.task=gym:chain_sum", "data.options={min_terms=0}"], "AssertionError: min_terms must be positive"),
    pytest.param(["data.task=gym:chain_sum", "data.options.train_size=100", 'workers.mode="threads"'],
                 "does not have ('S')", marks=pytest.mark.slow),  # the built-in character model, built first
])
def test_rlx_run_refuses_a_bad_gym_task_in_one_line_before_anything_is_written(tmp_path, capsys, sets, message):
    from runtime.cli import main

    out = tmp_path / "out"
    code = main(["run", "--out", str(out), "--no-progress", *[x for s in sets for x in ("--set", s)]])
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("rlx: ")]  # (JAX may warn about its cache)
    assert code == 2 and len(said) == 1 and message in said[0], err
    assert not out.exists()


def test_options_for_a_task_that_takes_none_and_a_data_file_are_refused():
    from runtime.session import make_task as session_task

    with pytest.raises(UsageError) as e:
        session_task(load_config(None, ["data.options={digits=2}"]))
    assert "data.options {'digits': 2} is not accepted by data.task 'arithmetic'" in one_line(e)
    with pytest.raises(UsageError) as e:
        session_task(load_config(None, ["data.task=gym:chain_sum", "data.path=x.jsonl"]))
    assert "reads no data file" in one_line(e)


def test_a_missing_reasoning_gym_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym raises ImportError
    with pytest.raises(UsageError) as e:
        make_task("gym:chain_sum")
    assert "needs reasoning-gym, which is not installed: pip install 'rlx[gym]' (or scripts/setup gym)" in one_line(e)


# number_sequence's default max_complexity=3 can take seconds for one entry (powers of huge numbers)
SEQUENCES = {"max_complexity": 2}


def test_the_built_in_character_model_needs_every_character_and_a_system_message_a_template():
    codec = TextCodec.builtin()
    with pytest.raises(UsageError) as e:
        gym().max_prompt_tokens(codec, limit=1000, why="test")
    assert "use characters the model's tokenizer does not have ('S')" in one_line(e)
    task = gym("number_sequence", **SEQUENCES)
    assert task.max_prompt_tokens(codec, limit=1000, why="test") == task.max_prompt_chars() + 1  # and <bos>
    assert task.max_prompt_chars() == max(len(task.problem(s, i).prompt) for s, n in (("train", 2000), ("eval", 50))
                                          for i in range(n))
    system = gym("number_sequence", system="Answer with a number.", **SEQUENCES)
    assert system.problem("eval", 0).messages == (("system", "Answer with a number."),
                                                  ("user", system.problem("eval", 0).prompt))
    with pytest.raises(UsageError, match="data.options.system is a system message, which needs"):
        system.max_prompt_tokens(codec, limit=1000, why="test")


def test_data_max_prompt_tokens_bounds_the_prompts_without_generating_them():
    capped = dataclasses.replace(TextCodec.builtin(), max_prompt_tokens=64)
    task = gym("number_sequence", **SEQUENCES)
    assert task.max_prompt_tokens(capped, limit=64, why="data.max_prompt_tokens") == 64
    assert "_scan" not in task.__dict__  # no problem was generated to count them
    with pytest.raises(UsageError, match=r"does not have \('S'\)"):  # the held-out split's characters are checked
        gym().max_prompt_tokens(capped, limit=64, why="data.max_prompt_tokens")


def test_a_gym_problem_is_not_written_as_a_data_row():
    with pytest.raises(UsageError, match="cannot be written as data rows"):
        gym().data_row(0)


@pytest.mark.slow
def test_a_run_on_a_gym_dataset_verifies_and_replays_bit_exactly(tmp_path, monkeypatch):
    from ledger import open_store
    from runtime.replay import replay_run
    from runtime.run import run
    from tests.runtime import small_run

    config = load_config(None, ['workers.mode="threads"', *small_run.TINY, "run.steps=2", "sampling.max_tokens=6",
                                "data.task=gym:number_sequence",
                                "data.options={max_complexity=2,train_size=500,eval_size=16}",
                                f'pretrain.cache_dir="{tmp_path / "warm_start"}"'])
    out = str(tmp_path / "run")
    summary = run(config, out, progress=False, log=lambda m: None)
    assert summary["final_version"] == 2
    with open_store(out) as store:
        assert store.verify("run").ok
        events = [s.event for s in store.read("run")]
    logged = events[0].config["data"]
    assert (logged["task"], logged["size"], logged["task_version"]) == ("gym:number_sequence", 500, installed_version())
    assert logged["options"] == {"max_complexity": 2, "train_size": 500, "eval_size": 16}
    outcomes = [e for e in events if type(e).__name__ == "OutcomeRecorded"]
    assert outcomes and {e.verifier for e in outcomes} == {"gym:number_sequence"}
    assert all(0.0 <= e.reward <= 1.0 for e in outcomes)
    report = replay_run(out, regenerate=True)
    assert report.match and report.final_digest == summary["final_digest"]
    monkeypatch.setattr("runtime.tasks.gym.installed_version", lambda: "0.0.1")
    with pytest.raises(UsageError, match=f"reasoning-gym {installed_version()} .data.task_version. but 0.0.1 is "):
        replay_run(out)
