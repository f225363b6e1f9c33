"""``rlx curate`` on a real small run (JSONL data, a seeded train/eval split): the curated file
holds the run's own rows for the prompts it kept, and the config and task loaders take it as
``--data``."""

from __future__ import annotations

import json

from runtime.cli import main


def test_curated_rows_are_the_runs_rows_and_load_as_data(small_run, tmp_path):
    from runtime.commands.run import _config
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
    loaded = make_task(_config(parser_args))  # what `rlx run --data curated.jsonl` loads
    assert loaded.train_size + loaded.eval_size == len(rows)
    assert sorted(loaded.problem("train", i).prompt for i in range(loaded.train_size)) == sorted(
        r["prompt"] for r in rows if r["prompt"] not in {loaded.problem("eval", j).prompt
                                                           for j in range(loaded.eval_size)})
