#!/usr/bin/env python
"""Ledger throughput: durable appends vs a raw sqlite3 baseline, and full-log verification.

Appends go through the public API (``EventStore.append``: encode, chain, fence and head check,
one ``BEGIN IMMEDIATE`` transaction per batch) on SQLite in WAL mode with synchronous=FULL. The
baseline inserts the same pre-encoded rows into the same table layout with the stdlib
``sqlite3`` driver, ``executemany`` in one ``BEGIN IMMEDIATE`` transaction per batch, at the
same durability. Ledger and baseline alternate in short slices (so a change in machine load
hits both alike) and each reports events over its own summed time.

Bytes: a demo-shaped run (``--bytes-steps`` steps of 256 rollouts through the controller with
simulated workers) is stored as written (bodies are arrays of field values) and, for comparison,
with the same events as map bodies (field names in every record, as older ledgers hold them):
file bytes and body bytes per event, and body bytes per event of each kind.

Usage: python scripts/bench_ledger.py [--slices 20] [--events 40000] [--bytes-steps 50] [--postgres URL]
The last line of output is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from ledger import RolloutAssigned, open_store  # noqa: E402
from ledger.codec import encode_event  # noqa: E402

BATCHES = (1, 10, 100, 1000)


def small_events(n: int, start: int = 0) -> list[RolloutAssigned]:
    return [RolloutAssigned("inference-17", (start + i,), (0,)) for i in range(n)]


class LedgerWriter:
    """Appends through the public API into a fresh SQLite ledger (WAL, synchronous=FULL)."""

    def __init__(self, path: str, batch: int):
        self.store = open_store(path, create=True)
        self.store.create_run("bench")
        self.epoch = self.store.acquire_epoch("bench")
        self.events = small_events(batch)
        self.head = 0

    def write(self, batches: int) -> None:
        for _ in range(batches):
            self.head = self.store.append("bench", self.events, expected_seq=self.head, epoch=self.epoch).seq

    def close(self) -> None:
        self.store.close()


class RawWriter:
    """The same rows, pre-encoded, through stdlib sqlite3 executemany at the same durability."""

    def __init__(self, path: str, batch: int):
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute(
            "CREATE TABLE rlx_events (run_id TEXT, seq INTEGER, kind TEXT, version INTEGER, body BLOB,"
            " digest BLOB, epoch INTEGER, wall_time REAL, PRIMARY KEY (run_id, seq)) WITHOUT ROWID"
        )
        self.encoded = [encode_event(e) for e in small_events(batch)]
        self.seq = 0

    def write(self, batches: int) -> None:
        digest = bytes(32)
        for _ in range(batches):
            rows = [("bench", self.seq + i + 1, k, v, b, digest, 1, 0.0) for i, (k, v, b) in enumerate(self.encoded)]
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.executemany("INSERT INTO rlx_events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
            self.conn.execute("COMMIT")
            self.seq += len(rows)

    def close(self) -> None:
        self.conn.close()


def bench_pair(tmp: str, batch: int, total: int, slices: int) -> tuple[float, float]:
    """Ledger and baseline alternate in ``slices`` short slices, so load drift hits both alike."""
    ledger = LedgerWriter(os.path.join(tmp, f"ledger-{batch}.db"), batch)
    raw = RawWriter(os.path.join(tmp, f"raw-{batch}.db"), batch)
    per_slice = max(1, total // batch // slices)
    times = {"ledger": 0.0, "raw": 0.0}
    for i in range(slices):
        order = (("ledger", ledger), ("raw", raw)) if i % 2 == 0 else (("raw", raw), ("ledger", ledger))
        for name, w in order:
            t = time.perf_counter()
            w.write(per_slice)
            times[name] += time.perf_counter() - t
    n = per_slice * slices * batch
    ledger.close()
    raw.close()
    return n / times["ledger"], n / times["raw"]


def bench_replay(path: str, n: int) -> dict:
    with open_store(path, create=True) as store:
        store.create_run("replay")
        epoch = store.acquire_epoch("replay")
        head = 0
        for start in range(0, n, 1000):
            head = store.append("replay", small_events(1000, start), expected_seq=head, epoch=epoch).seq
        t = time.perf_counter()
        report = store.verify("replay")  # read + chain + decode of every body
        verify_s = time.perf_counter() - t
        t = time.perf_counter()
        count = sum(1 for _ in store.read("replay"))
        read_s = time.perf_counter() - t
    assert report.ok and report.events == n == count
    return {"replay_eps": n / verify_s, "read_decode_eps": n / read_s, "replay_events": n}


def _file_bytes(path: str) -> int:
    """The size of a closed SQLite ledger: its write-ahead log is checkpointed into the file."""
    return sum(os.path.getsize(path + suffix) for suffix in ("", "-wal") if os.path.exists(path + suffix))


def bench_bytes(tmp: str, steps: int) -> dict:
    """Bytes per event of a demo-shaped run (groups of 8, 32 a batch, 5-token completions),
    written through the controller with simulated workers: as stored now (bodies are arrays of
    field values) and with the same events stored as map bodies (field names in every record,
    as ledgers were written before), each in a fresh SQLite file."""
    from ledger.codec import encode_map_body
    from runtime.config import load_config
    from runtime.controller import ControllerLoop
    from runtime.controller.simulation import run_to_end

    config = load_config(None, [f"run.steps={steps}", "sampling.group_size=8", "scheduling.groups_per_batch=32",
                                "sampling.max_tokens=5", "scheduling.max_staleness=1"], data_size=100_000)
    with open_store(os.path.join(tmp, "arrays.db"), create=True, synchronous="OFF") as store:
        loop = ControllerLoop.create(store, run_id="demo", config=config.to_dict(), config_digest=config.digest(),
                                     seed=config.run.seed)
        run_to_end(loop, workers=1, slots=256)
        events = store.events("demo")
        arrays = store.stats()
    arrays["file_bytes"] = _file_bytes(os.path.join(tmp, "arrays.db"))
    with open_store(os.path.join(tmp, "maps.db"), create=True, synchronous="OFF") as store:
        store.create_run("demo")
        epoch, head = store.acquire_epoch("demo"), 0
        for i in range(0, len(events), 1000):
            records = [(e.KIND, e.VERSION, encode_map_body(e)) for e in events[i : i + 1000]]
            head = store._append_encoded("demo", records, head, epoch).seq
        assert store.events("demo") == events  # the same facts either way
        maps = store.stats()
    maps["file_bytes"] = _file_bytes(os.path.join(tmp, "maps.db"))
    n = len(events)
    by_kind = {k: round(b / arrays["events_by_kind"][k], 1) for k, b in sorted(arrays["body_bytes_by_kind"].items())}
    return {
        "bytes_events": n,
        "bytes_per_event": round(arrays["file_bytes"] / n, 1),
        "body_bytes_per_event": round(arrays["body_bytes"] / n, 1),
        "map_bytes_per_event": round(maps["file_bytes"] / n, 1),
        "map_body_bytes_per_event": round(maps["body_bytes"] / n, 1),
        "bytes_vs_map": round(arrays["file_bytes"] / maps["file_bytes"], 3),
        "body_bytes_per_event_by_kind": by_kind,
        "map_body_bytes_per_event_by_kind": {k: round(b / maps["events_by_kind"][k], 1)
                                             for k, b in sorted(maps["body_bytes_by_kind"].items())},
    }


def bench_postgres(url: str, batch: int, total: int) -> float | None:
    try:
        import psycopg

        admin = psycopg.connect(url, autocommit=True, connect_timeout=3)
    except Exception as e:  # no server: report it, do not fail the benchmark
        print(f"postgres: skipped ({str(e).strip().splitlines()[0]})", file=sys.stderr)
        return None
    schema = f"rlx_bench_{os.getpid()}"
    admin.execute(f"CREATE SCHEMA {schema}")
    try:
        sep = "&" if "?" in url else "?"
        with open_store(f"{url}{sep}options=-csearch_path%3D{schema}", create=True) as store:
            store.create_run("bench")
            epoch = store.acquire_epoch("bench")
            evs = small_events(batch)
            head = 0
            t = time.perf_counter()
            for _ in range(total // batch):
                head = store.append("bench", evs, expected_seq=head, epoch=epoch).seq
            return head / (time.perf_counter() - t)
    finally:
        admin.execute(f"DROP SCHEMA {schema} CASCADE")
        admin.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slices", type=int, default=20, help="alternating slices per batch size")
    ap.add_argument("--events", type=int, default=40000, help="events per writer at batch >= 100")
    ap.add_argument("--replay-events", type=int, default=200000)
    ap.add_argument("--bytes-steps", type=int, default=50, help="steps of the demo-shaped run whose bytes are counted")
    ap.add_argument("--postgres", default=os.environ.get("RLX_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    args = ap.parse_args()

    result: dict = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version, "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        for batch in BATCHES:
            total = {1: 2000, 10: 10000}.get(batch, args.events)
            le, re_ = bench_pair(tmp, batch, total, args.slices)
            result[f"append_eps_batch{batch}"] = round(le)
            result[f"raw_sqlite_eps_batch{batch}"] = round(re_)
            result[f"append_vs_raw_batch{batch}"] = round(le / re_, 3)
            print(f"batch {batch:>4}: ledger {le:>9.0f} ev/s   raw sqlite3 {re_:>9.0f} ev/s   ratio {le / re_:.2f}", file=sys.stderr)
        result.update(bench_replay(os.path.join(tmp, "replay.db"), args.replay_events))
        result.update(bench_bytes(tmp, args.bytes_steps))
        print(f"bytes per event: {result['bytes_per_event']} (map bodies: {result['map_bytes_per_event']})",
              file=sys.stderr)
        print(f"verify (read+decode+chain): {result['replay_eps']:.0f} ev/s", file=sys.stderr)
    pg = bench_postgres(args.postgres, 100, 5000)
    result["postgres_append_eps_batch100"] = None if pg is None else round(pg)
    if pg is not None:
        print(f"postgres batch 100: {pg:.0f} ev/s", file=sys.stderr)
    result["replay_eps"] = round(result["replay_eps"])
    result["read_decode_eps"] = round(result["read_decode_eps"])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
