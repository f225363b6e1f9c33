#!/usr/bin/env python
"""A verifier bug injected into a real run, and ``rlx audit DIR taint`` naming what it reached.

    python scripts/bench_taint.py [--steps 8] [--one-in 50] [--out DIR]

Runs ``rlx run`` on two-digit sums with a tiny model, scored by a reward file with a bug: it
judges a completion right when it is the exact sum, except that it turns the verdict round for
one (prompt, completion) pair in ``--one-in`` (a fixed 2% by default, chosen by a hash of the
pair). Then ``rlx audit DIR taint --verifier right.py --json`` (a separate process) judges every
recorded completion again with the same function without the bug. The truth is recomputed
here from the run's events: the flipped outcomes (the hash of each prompt's and completion's
text), the steps whose batches hold one, and every version from the first of those steps on.
``precision`` and ``recall`` are the lowest over outcomes, steps and versions (each kind's are
listed too); ``first_tainted_version`` is the command's, ``expected_first_tainted_version``
the truth's. Then ``rlx replay DIR --rescore right.py --out DIR2 --json`` re-derives the run from
just before the first outcome judged otherwise, with the right verifier (the run keeps every
version, so the fork finds the weights it starts from), and a clean run that had ``right.py``
from the start is run beside it: ``rescore_digest_match`` says whether the two end on the same
final weights digest (deterministic mode promises it), ``rescore_from_version`` where the
re-derivation started and ``rescore_steps`` how many steps it trained. The last line printed is
one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ledger import events as ev  # noqa: E402
from ledger import open_store  # noqa: E402
from runtime import rundir  # noqa: E402,F401  (a run directory opens as its ledger)
from runtime.config import Config  # noqa: E402
from runtime.session import build_codec, make_task  # noqa: E402

BUGGY = '''import hashlib


def reward(prompt, completion, answer):
    right = 1.0 if completion.strip() == answer else 0.0
    if int(hashlib.sha256(f"{prompt}\\x00{completion}".encode()).hexdigest(), 16) % ONE_IN == 0:
        return 1.0 - right
    return right
'''
RIGHT = '''def reward(prompt, completion, answer):
    return 1.0 if completion.strip() == answer else 0.0
'''
TINY = ["pretrain.steps=20", "eval.size=16", "scheduling.groups_per_batch=4", "sampling.group_size=4",
        "sampling.max_tokens=4", "workers.inference_slots=16", "model.hidden_size=32", "model.num_layers=1",
        "model.num_heads=2", "model.num_kv_heads=1", "model.intermediate_size=64"]


def rlx(*argv: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "runtime.cli", *argv], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode not in ok:
        raise SystemExit(f"rlx {' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def truth(out: str, one_in: int) -> tuple[set[int], set[int], set[int], int]:
    """(flipped outcomes, steps that consumed one, versions from the first such step on, outcomes)."""
    with open_store(out, readonly=True) as store:
        events = [s.event for s in store.read("run")]
    assert isinstance(events[0], ev.RunStarted)
    config = Config.from_dict(events[0].config)
    task, codec = make_task(config), build_codec(config)
    prompt = {q.rollout_id: task.problem("train", q.prompt_index).prompt
              for e in events if isinstance(e, ev.RolloutRequested) for q in e.samples()}
    scored = {e.rollout_id for e in events if isinstance(e, ev.OutcomeRecorded)}
    flipped = {e.rollout_id for e in events if isinstance(e, ev.RolloutCompleted) and e.rollout_id in scored
               and int(hashlib.sha256(f"{prompt[e.rollout_id]}\x00{codec.decode(e.tokens)}".encode()).hexdigest(),
                       16) % one_in == 0}
    steps = {e.step for e in events if isinstance(e, ev.BatchFormed) and flipped & set(e.rollout_ids)}
    versions = {e.version for e in events if isinstance(e, ev.WeightsPublished) and steps and e.version >= min(steps)}
    return flipped, steps, versions, len(scored)


def scores(named: set[int], true: set[int]) -> dict[str, float]:
    hit = len(named & true)
    return {"precision": hit / len(named) if named else 1.0, "recall": hit / len(true) if true else 1.0,
            "named": len(named), "true": len(true)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--one-in", type=int, default=50, help="the bug flips one pair in this many (50: 2%%)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", help="where the run goes (default: a temporary directory)")
    args = parser.parse_args()

    root = pathlib.Path(args.out or tempfile.mkdtemp(prefix="bench_taint_"))
    root.mkdir(parents=True, exist_ok=True)
    (root / "sums.jsonl").write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                                             for a in range(10) for b in range(10)), encoding="utf-8")
    (root / "buggy.py").write_text(BUGGY.replace("ONE_IN", str(args.one_in)), encoding="utf-8")
    (root / "right.py").write_text(RIGHT, encoding="utf-8")
    out = str(root / "run")

    def run(directory: str, reward: str) -> None:
        argv = ["run", "--out", directory, "--no-progress", "--steps", str(args.steps), "--seed", str(args.seed),
                "--data", str(root / "sums.jsonl"), "--set", f'pretrain.cache_dir="{root / "warm"}"',
                "--set", f'verifier.reward="{root / reward}"', "--set", f"params.keep_newest={args.steps + 1}"]
        for o in TINY:
            argv += ["--set", o]
        rlx(*argv)

    start = time.perf_counter()
    run(out, "buggy.py")
    run_s = time.perf_counter() - start
    start = time.perf_counter()
    taint = rlx("audit", out, "taint", "--verifier", str(root / "right.py"), "--json", ok=(0, 1))  # 1: some changed
    doc = json.loads(taint.stdout)
    taint_s = time.perf_counter() - start

    start = time.perf_counter()
    rescored = json.loads(rlx("replay", out, "--rescore", str(root / "right.py"), "--out", str(root / "rescored"),
                              "--no-progress", "--json").stdout.strip().splitlines()[-1])
    rescore_s = time.perf_counter() - start
    start = time.perf_counter()
    run(str(root / "clean"), "right.py")
    clean_s = time.perf_counter() - start
    with open(root / "clean" / "summary.json", encoding="utf-8") as f:
        clean_digest = json.load(f)["final_digest"]
    with open(root / "run" / "summary.json", encoding="utf-8") as f:
        buggy_digest = json.load(f)["final_digest"]

    flipped, steps, versions, outcomes = truth(out, args.one_in)
    kinds = {
        "outcomes": scores({c["rollout_id"] for c in doc["changed"]}, flipped),
        "steps": scores({s["step"] for s in doc["steps"]}, steps),
        "versions": scores({v["version"] for v in doc["versions"]}, versions),
    }
    result = {
        "steps": args.steps,
        "outcomes": outcomes,
        "flipped": len(flipped),
        "flipped_fraction": round(len(flipped) / outcomes, 4) if outcomes else 0.0,
        "precision": min(k["precision"] for k in kinds.values()),
        "recall": min(k["recall"] for k in kinds.values()),
        **{f"{kind}_{m}": k[m] for kind, k in kinds.items() for m in ("precision", "recall", "named", "true")},
        "first_tainted_version": doc["first_tainted_version"],
        "expected_first_tainted_version": min(versions, default=None),
        "versions_published": doc["versions_published"],
        "sampled_from_tainted": doc["sampled_from_tainted"],
        "run_s": round(run_s, 1),
        "taint_s": round(taint_s, 2),
        "rescore_digest_match": rescored["final_digest"] == clean_digest,
        "rescore_differs_from_buggy": rescored["final_digest"] != buggy_digest,
        "rescore_from_version": rescored["version"],
        "rescore_from_seq": rescored["parent_seq"],
        "rescore_steps": args.steps - rescored["version"],
        "rescore_s": round(rescore_s, 1),
        "clean_run_s": round(clean_s, 1),
    }
    print(f"{len(flipped)} of {outcomes} outcomes flipped by the bug; taint named {kinds['outcomes']['named']} "
          f"outcomes, {kinds['steps']['named']} steps, {kinds['versions']['named']} versions (first "
          f"{doc['first_tainted_version']}, expected {result['expected_first_tainted_version']}) in {taint_s:.1f} s; "
          f"re-scored from version {rescored['version']} in {rescore_s:.1f} s: final digest "
          f"{'matches' if result['rescore_digest_match'] else 'DIFFERS from'} the clean run's; run directory {root}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
