"""``rlx curate`` on real small runs: the curated file holds the run's own rows for the prompts
it kept (JSONL data, a seeded train/eval split; codefn function-test rows), and the next run
takes it as ``--data`` and judges it as the first run did."""

from __future__ import annotations

import json

import pytest

from runtime.cli import main


@pytest.mark.slow
def test_curated_rows_are_the_runs_rows_and_load_as_data(small_run, tmp_path):
    from runtime.commands.run import config_from_args
    from runtime.session import make_task

    out, _, config = small_run
    curated = str(tmp_path / "curated.jsonl")
    # Every sampled prompt with an outcome (a 3-step run may have no mixed-outcome prompt).
    assert main(["curate", out, "--out", curated, "--min-pass", "0", "--max-pass", "1"]) == 0
    stats = [json.loads(line) for line in open(curated + ".stats.jsonl")]
    rows = [json.loads(line) for line in open(curated)]
    kept = [s["prompt_index"] for s in stats if s["kept"]]
    assert len(kept) == len(rows) >= 2 and all(s["rollouts"] > 0 for s in stats if s["kept"])
    task = make_task(config)  # the run's task: its train split of the JSONL file
    for i, row in zip(kept, rows, strict=True):
        p = task.problem("train", i)
        assert row == {"prompt": p.prompt, "answer": p.answer}
    parser_args = type("A", (), {"config": None, "overrides": [], "steps": None, "steps_field": "run.steps",
                                 "seed": None, "model": None, "data": curated})()
    loaded = make_task(config_from_args(parser_args))  # what `rlx run --data curated.jsonl` loads
    assert loaded.train_size + loaded.eval_size == len(rows)
    assert sorted(loaded.problem("train", i).prompt for i in range(loaded.train_size)) == sorted(
        r["prompt"] for r in rows if r["prompt"] not in {loaded.problem("eval", j).prompt
                                                           for j in range(loaded.eval_size)})


def _codefn_config(path: str, cache_dir: str):
    from runtime.config import Config

    return Config.from_dict({
        "run": {"steps": 3, "seed": 0},
        "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64},
        "pretrain": {"steps": 200, "batch_size": 32, "cache_dir": cache_dir},
        "eval": {"size": 4},
        "data": {"task": "codefn", "path": path},
        "sampling": {"group_size": 4, "max_tokens": 12},
        "scheduling": {"groups_per_batch": 4, "max_staleness": 1},
        "trainer": {"learning_rate": 1e-2},
        "workers": {"inference_slots": 16, "mode": "threads"},
        "params": {"keep_newest": 1},
    })


def _outcomes_by_prompt(out: str) -> dict[int, list]:
    from ledger import open_store

    prompt_of, by_prompt = {}, {}
    with open_store(out, readonly=True) as store:
        for s in store.read("run"):
            e = s.event
            if s.kind == "RolloutRequested":
                prompt_of.update(dict.fromkeys(e.rollout_ids, e.prompt_index))
            elif s.kind == "OutcomeRecorded":
                by_prompt.setdefault(prompt_of[e.rollout_id], []).append(e)
    return by_prompt


def test_a_generated_codefn_run_curates_to_function_test_rows_the_codefn_task_reads(tmp_path):
    from runtime.commands.run import config_from_args
    from runtime.config import Config
    from runtime.curation import DataSource
    from runtime.session import make_task

    config = Config.from_dict({"data": {"task": "codefn"}, "run": {"seed": 4}}).resolved(data_size=20000)
    source = DataSource(config.to_dict())
    rows = [source.row(i) for i in (7, 3)]
    assert rows == [make_task(config).data_row(i) for i in (7, 3)] and set(rows[0]) == {"prompt", "calls", "target"}
    path = str(tmp_path / "curated.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    assert source.run_args(path) == f"--data {path} --set data.task=codefn"
    args = type("A", (), {"config": None, "overrides": ["data.task=\"codefn\"", "run.seed=4"], "steps": None,
                          "steps_field": "run.steps", "seed": None, "model": None, "data": path})()
    task = make_task(config_from_args(args))  # what `rlx run --data curated.jsonl --set data.task=codefn` loads
    assert task.name == "codefn" and task.path == path
    generated = make_task(config)
    assert [task.problem("train", k) for k in range(2)] == [generated.problem("train", i) for i in (7, 3)]
    assert task.problem("eval", 11) == generated.problem("eval", 11)


@pytest.mark.slow
def test_curating_a_codefn_run_keeps_the_mixed_prompts_and_the_next_run_trains_on_them_in_the_sandbox(tmp_path):
    from runtime.run import run
    from runtime.session import make_task
    from runtime.tasks import CodeFunctions

    generated = CodeFunctions()
    rows = [generated.data_row(i) for i in range(12)]  # few enough that a tiny warm start solves some
    data, curated, cache = str(tmp_path / "fns.jsonl"), str(tmp_path / "curated.jsonl"), str(tmp_path / "warm")
    with open(data, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    first = str(tmp_path / "first")
    run(_codefn_config(data, cache), first, progress=False, log=lambda m: None)
    by_prompt = _outcomes_by_prompt(first)
    mixed = sorted(i for i, os_ in by_prompt.items() if 0 < sum(o.passed for o in os_) < len(os_))
    assert mixed and len(mixed) < len(by_prompt), {i: [o.passed for o in os_] for i, os_ in by_prompt.items()}
    assert main(["curate", first, "--out", curated]) == 0
    assert [json.loads(line) for line in open(curated)] == [rows[i] for i in mixed]  # the file's rows, verbatim
    stats = [json.loads(line) for line in open(curated + ".stats.jsonl")]
    assert sorted(s["prompt_index"] for s in stats) == sorted(by_prompt)
    assert [s["prompt_index"] for s in stats if s["kept"]] == mixed

    second = str(tmp_path / "second")
    run(_codefn_config(curated, cache), second, progress=False, log=lambda m: None)
    from ledger import open_store

    with open_store(second, readonly=True) as store:
        started = next(iter(store.read("run"))).event
    assert started.config["data"]["path"] == curated and started.config["data"]["size"] == len(mixed)
    task = make_task(_codefn_config(curated, cache))
    sampled = _outcomes_by_prompt(second)
    assert sampled and set(sampled) <= set(range(len(mixed)))
    assert {task.problem("train", i).prompt for i in sampled} <= {rows[i]["prompt"] for i in mixed}
    outcomes = [o for os_ in sampled.values() for o in os_]
    assert {o.verifier for o in outcomes} == {"code"}  # judged by running the function, not as an expression
