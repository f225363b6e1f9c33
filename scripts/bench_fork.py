#!/usr/bin/env python
"""What a fork costs and what it shares: ``rlx fork RUN --at V`` against the run it forks.

    python scripts/bench_fork.py [--steps 12] [--at 10] [--out DIR]

Runs ``rlx run`` (two-digit sums, a tiny model, every version kept), then forks it at version
``--at`` twice: once changing nothing, once with another learning rate. Reports the time to
create a fork (``--no-run``: copying the shared records, linking the weights, recording
``RunForked``) and to run it to the end, against the parent's whole run; how many ledger records
the fork shares with the parent; how many of the fork's weight files are hard links to the
parent's (bytes copied: none on one file system); whether the unchanged fork ends on the
parent's final digest and the changed one elsewhere; and whether ``rlx ledger verify`` and
``rlx replay`` accept the changed fork. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
TINY = ["pretrain.steps=200", "pretrain.batch_size=32", "trainer.learning_rate=1e-2", "eval.size=16", "eval.every_steps=0", "scheduling.groups_per_batch=4",
        "sampling.group_size=4", "sampling.max_tokens=4", "workers.inference_slots=16", "model.hidden_size=32",
        "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1", "model.intermediate_size=64"]


def rlx(*argv: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "runtime.cli", *argv], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"rlx {' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc, time.perf_counter() - start


def final_digest(directory: pathlib.Path) -> str:
    with open(directory / "summary.json", encoding="utf-8") as f:
        return json.load(f)["final_digest"]


def files(directory: pathlib.Path) -> dict[str, os.stat_result]:
    return {str(p.relative_to(directory)): p.stat() for p in directory.rglob("*") if p.is_file()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--at", type=int, default=10)
    parser.add_argument("--out", help="where the runs go (default: a temporary directory)")
    args = parser.parse_args()

    root = pathlib.Path(args.out or tempfile.mkdtemp(prefix="bench_fork_"))
    root.mkdir(parents=True, exist_ok=True)
    (root / "sums.jsonl").write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                                             for a in range(5) for b in range(5)), encoding="utf-8")
    parent = root / "parent"
    argv = ["run", "--out", str(parent), "--no-progress", "--steps", str(args.steps), "--data",
            str(root / "sums.jsonl"), "--set", f'pretrain.cache_dir="{root / "warm"}"',
            "--set", f"params.keep_newest={args.steps + 1}"]
    for o in TINY:
        argv += ["--set", o]
    rlx(*argv, "--steps", "1", "--out", str(root / "warmup"))  # compiles and warm-starts; not measured
    _, parent_s = rlx(*argv)

    same, other = root / "same", root / "lr"
    _, create_s = rlx("fork", str(parent), "--at", str(args.at), "--out", str(same), "--no-run")
    _, same_run_s = rlx("resume", str(same), "--no-progress")
    _, other_s = rlx("fork", str(parent), "--at", str(args.at), "--out", str(other), "--no-progress",
                     "--set", "trainer.learning_rate=3e-3")
    verify, _ = rlx("ledger", "verify", str(other), "--json")
    replay, replay_s = rlx("replay", str(other), "--json")

    sys.path.insert(0, str(ROOT))
    from ledger import events as ev
    from ledger import open_store
    from runtime import rundir  # noqa: F401  (a run directory opens as its ledger)

    with open_store(str(same), readonly=True) as store:
        forked = next(s.event for s in store.read("run") if isinstance(s.event, ev.RunForked))
        fork_events = store.count("run")
    with open_store(str(parent), readonly=True) as store:
        parent_events = store.count("run")
    mine, theirs = files(same / "params"), files(parent / "params")
    taken = {f"v{v}" for v in range(args.at + 1)}  # the versions the fork took from the parent

    def version(name: str) -> str:
        return name.removeprefix("manifests/").removesuffix(".json").split("/")[0]

    shared = [name for name in mine if name in theirs and version(name) in taken]
    linked = [name for name in shared if theirs[name].st_ino == mine[name].st_ino]
    copied = sum(mine[name].st_size for name in shared if name not in linked)
    versions_shared = len({name.split("/")[1] for name in linked if name.startswith("manifests/")})
    result = {
        "steps": args.steps,
        "at": args.at,
        "parent_s": round(parent_s, 1),
        "fork_create_s": round(create_s, 2),
        "fork_run_s": round(same_run_s, 1),
        "changed_fork_s": round(other_s, 1),
        "events_parent": parent_events,
        "events_shared": forked.parent_seq,
        "events_fork": fork_events,
        "weight_files_linked": len(linked),
        "weight_versions_linked": versions_shared,
        "weight_bytes_copied_from_parent": copied,
        "same_digest": final_digest(same) == final_digest(parent),
        "changed_digest_differs": final_digest(other) != final_digest(parent),
        "changed_fork_verifies": json.loads(verify.stdout)["ok"],
        "changed_fork_replays": json.loads(replay.stdout)["match"],
        "replay_s": round(replay_s, 1),
    }
    print(f"forked at version {args.at} of {args.steps} in {create_s:.1f} s ({forked.parent_seq} of {parent_events} "
          f"records shared, {len(linked)} weight files linked, {copied} bytes of weights copied); the unchanged fork "
          f"{'ends on' if result['same_digest'] else 'MISSES'} the parent's final digest; runs in {root}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
