"""Tasks: deterministic problems, disjoint held-out splits, real verifiers, JSONL validation."""

from __future__ import annotations

import json

import pytest

from runtime.errors import UsageError
from runtime.model import char_tokenizer
from runtime.tasks import make_task
from runtime.tasks.base import TextCodec, nth_kept, split_indices


def test_arithmetic_problems_and_held_out_split():
    task = make_task("arithmetic", digits=2, eval_size=50, seed=3)
    assert task.train_size == 10_000 - 50 and task.eval_size == 50
    train = {task.problem("train", i).prompt for i in range(task.train_size)}
    held = {task.problem("eval", i).prompt for i in range(task.eval_size)}
    assert len(train) == task.train_size and len(held) == 50 and not train & held
    p = task.problem("eval", 0)
    a, b = (int(x) for x in p.prompt[:-1].split("+"))
    assert p.answer == str(a + b) and p.prompt == f"{a:02d}+{b:02d}="
    assert make_task("arithmetic", digits=2, eval_size=50, seed=3).problem("train", 77) == task.problem("train", 77)


def test_nth_kept_skips_excluded_indices():
    excluded = split_indices(100, 30, seed=1)
    kept = [nth_kept(i, excluded) for i in range(70)]
    assert kept == [x for x in range(100) if x not in set(excluded.tolist())]


def test_arithmetic_scoring_uses_the_math_verifier():
    task = make_task("arithmetic")
    p = task.problem("train", 5)
    good, bad, junk = task.score([p, p, p], [p.answer, str(int(p.answer) + 1), "x+y"])
    assert (good.reward, good.passed, good.verdict, good.verifier) == (1.0, True, "AC", "math")
    assert (bad.reward, bad.passed, bad.verdict) == (0.0, False, "WA")
    assert not junk.passed


def test_codefn_held_out_functions_are_never_trained_and_sandbox_scores_fractions():
    task = make_task("codefn", problems=400, eval_size=40, seed=0)
    train = {task.problem("train", i).answer for i in range(400)}
    held = {task.problem("eval", i).answer for i in range(40)}
    assert not train & held
    p = task.problem("train", 3)
    a = int(p.answer.split("*")[0])
    wrong_offset = f"{a}*x+{1000}"
    half = f"({p.answer}) if x > 0 else 10**6"  # right on the positive hidden points only
    right, wrong, broken, partial = task.score([p] * 4, [p.answer, wrong_offset, "x +", half])
    assert (task.reward(right), right.passed, right.verdict, right.verifier) == (1.0, True, "AC", "code")
    assert task.reward(wrong) == 0.0 and wrong.verdict == "WA"
    assert task.reward(broken) == 0.0 and not broken.passed
    positive = sum(1 for x, _ in p.tests if x > 0)
    assert 0 < positive < len(p.tests) and not partial.passed
    assert task.reward(partial) == positive / len(p.tests)


def test_text_codec_round_trip_with_bos_and_eos():
    codec = TextCodec(char_tokenizer())
    p = make_task("arithmetic").problem("train", 9)
    ids = codec.encode_prompt(p)
    assert ids[0] == codec.bos_id and codec.decode(ids[1:]) == p.prompt
    target = codec.target_ids(p)
    assert target[-1] == codec.eos_ids[0] and codec.decode(target + [7, 8]) == p.answer


def test_jsonl_rows_split_and_score(tmp_path):
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(20)]
    rows.append({"prompt": "echo", "tests": [{"input": "hi\n", "output": "hi\n"}]})
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    task = make_task("jsonl", path=str(path), eval_fraction=0.25, seed=0)
    assert task.train_size + task.eval_size == 21 and task.eval_size == 5
    problems = [task.problem("train", i) for i in range(task.train_size)]
    code = next(p for p in problems + [task.problem("eval", i) for i in range(5)] if p.tests)
    math = next(p for p in problems if p.answer)
    out = task.score([math, code, code], [math.answer, "print(input())", "print('no')"])
    assert [o.passed for o in out] == [True, True, False]


@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"prompt": "a", "answer": "1"}', "not json"], "data.jsonl:2: not valid JSON"),
        (['{"prompt": "a", "answer": "1"}', '{"prompt": "b"}'], "data.jsonl:2: give exactly one of"),
        (['{"prompt": "a", "answer": "1"}', '{"prompt": "", "answer": "1"}'], "'prompt' must be a non-empty"),
        (['{"prompt": "a", "answer": "1"}', '{"prompt": "b", "tests": [{"input": 1}]}'], "tests[0]"),
        (['{"prompt": "a", "answer": "1", "extra": 1}', '{"prompt": "b", "answer": "2"}'], "unknown keys ['extra']"),
        (['{"prompt": "a", "answer": "1"}'], "need at least 2"),
        (['{"prompt": "a", "answer": "1"}', '{"prompt": "b", "messages": [], "answer": "1"}'],
         "data.jsonl:2: give exactly one of 'prompt' (text) or 'messages' (a chat)"),
        (['{"prompt": "a", "answer": "1"}', '{"messages": [], "answer": "1"}'], "'messages' must be a list of 1..1024"),
        (['{"prompt": "a", "answer": "1"}', '{"messages": [{"role": "robot", "content": "x"}], "answer": "1"}'],
         "data.jsonl:2: messages[0] must be {\"role\": one of system, user, assistant, tool"),
    ],
)
def test_malformed_jsonl_rows_are_named(tmp_path, lines, message):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(UsageError) as info:
        make_task("jsonl", path=str(path))
    assert message in str(info.value)


def test_unknown_task_and_parameters():
    with pytest.raises(UsageError, match="unknown task 'nope'; accepted: arithmetic, codefn, jsonl"):
        make_task("nope")
    with pytest.raises(UsageError, match="digits"):
        make_task("arithmetic", digits=9)


@pytest.mark.parametrize("name, params", [("arithmetic", {"digits": 2, "eval_size": 50}), ("codefn", {"problems": 3000, "eval_size": 100})])
def test_max_prompt_chars_bounds_every_prompt(name, params):
    task = make_task(name, **params)
    lengths = [len(task.problem(split, i).prompt) for split, n in (("train", task.train_size), ("eval", task.eval_size))
               for i in range(n)]
    assert max(lengths) <= task.max_prompt_chars()
    if name == "arithmetic":
        assert max(lengths) == task.max_prompt_chars()


def test_messages_rows_keep_their_chat_and_line_numbers(tmp_path):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1="}]
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": chat, "answer": "2"}) + "\n\n" + json.dumps({"prompt": "2+2=", "answer": "4"})
                    + "\n")
    task = make_task("jsonl", path=str(path), eval_fraction=0.5, seed=0)
    problems = {task.prompt_where(s, 0): task.problem(s, 0) for s in ("train", "eval")}
    assert sorted(problems) == [f"{path}:1", f"{path}:3"]  # the blank line is counted
    first = problems[f"{path}:1"]
    assert first.messages == (("system", "Be brief."), ("user", "1+1=")) and first.prompt == "1+1="
    codec = TextCodec.builtin()
    with pytest.raises(UsageError, match=r'\{"messages"\} row needs the checkpoint\'s chat template'):
        task.max_prompt_tokens(codec, limit=100, why="test")


def test_a_character_level_tokenizer_counts_characters():
    from runtime.model.tokenizer import one_token_per_char
    from tests.runtime.model.tiny_checkpoint import bpe_tokenizer

    assert one_token_per_char(char_tokenizer()) and TextCodec.builtin().char_level
    assert not one_token_per_char(bpe_tokenizer(["12+34=", "46"]))
    task = make_task("arithmetic", digits=2, eval_size=50)
    assert task.max_prompt_tokens(TextCodec.builtin(), limit=1, why="unused") == 2 * 2 + 2 + 1  # "ab+cd=" and <bos>


def test_codefn_rows_read_back_as_the_same_problems_judged_in_the_sandbox(tmp_path):
    gen = make_task("codefn", problems=400, eval_size=40, seed=3)
    picked = [5, 0, 17]
    rows = [gen.data_row(i) for i in picked]
    p = gen.problem("train", 5)
    assert rows[0] == {"prompt": p.prompt, "calls": [{"args": [x], "output": y} for x, y in p.tests], "target": p.target}
    path = tmp_path / "fns.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '\n{"prompt": "f(0)=1;f(x)=", "calls": '
                    '[{"args": [2], "output": 5}]}\n')  # a row without a target: trained by RL only
    task = make_task("codefn", path=str(path), eval_size=40, seed=3)
    assert (task.train_size, task.eval_size) == (4, 40)
    assert [task.problem("train", k) for k in range(3)] == [gen.problem("train", i) for i in picked]
    assert [task.problem("eval", j) for j in range(40)] == [gen.problem("eval", j) for j in range(40)]  # same held-out
    assert task.supervised_indices().tolist() == [0, 1, 2]
    assert task.describe()["path"] == str(path) and "path" not in gen.describe()
    assert [task.prompt_where("train", 2), task.prompt_where("train", 3)] == [f"{path}:3", f"{path}:5"]  # blank line 4
    assert task.prompt_where("eval", 1) == gen.prompt_where("eval", 1)
    q = task.problem("train", 3)
    outcomes = task.score([p, p, q, q], [p.target, "x", "2*x+1", "2*x"])
    assert [(o.verifier, o.verdict) for o in outcomes] == [("code", "AC"), ("code", "WA"), ("code", "AC"), ("code", "WA")]
    assert [task.reward(o) for o in outcomes] == [1.0, gen.reward(gen.score([p], ["x"])[0]), 1.0, 0.0]
    assert task.max_prompt_chars() == gen.max_prompt_chars()


@pytest.mark.parametrize(
    "line, message",
    [
        ("not json", "fns.jsonl:1: not valid JSON"),
        ('{"prompt": "f(x)=", "answer": "1"}', "unknown keys ['answer']; a codefn row accepts: prompt, calls, target"),
        ('{"prompt": "f(x)=", "calls": []}', "'calls' must be a list of 1 to 64"),
        ('{"prompt": "f(x)=", "calls": [{"args": [1, 2], "output": 3}]}', "calls[0] must be"),
        ('{"prompt": "f(x)=", "calls": [{"args": [true], "output": 3}]}', "calls[0] must be"),
        ('{"prompt": "f(x)=", "calls": [{"args": [1], "output": "3"}]}', "calls[0] must be"),
        ('{"prompt": "", "calls": [{"args": [1], "output": 3}]}', "'prompt' must be a non-empty string"),
        ('{"prompt": "f(x)=", "calls": [{"args": [1], "output": 3}], "target": 7}', "'target' must be a string"),
    ],
)
def test_malformed_codefn_rows_are_named(tmp_path, line, message):
    path = tmp_path / "fns.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(UsageError) as info:
        make_task("codefn", path=str(path))
    assert message in str(info.value)
    with pytest.raises(UsageError, match="has no rows"):
        (tmp_path / "empty.jsonl").write_text("\n")
        make_task("codefn", path=str(tmp_path / "empty.jsonl"))


def test_codefn_rows_given_as_plain_jsonl_say_which_task_reads_them(tmp_path):
    path = tmp_path / "fns.jsonl"
    path.write_text('{"prompt": "f(x)=", "calls": [{"args": [1], "output": 3}]}\n' * 2)
    with pytest.raises(UsageError, match="'calls' rows are function tests of the codefn task; read this file with "
                                         "--set data.task=codefn"):
        make_task("jsonl", path=str(path))
