"""Crash safety with real processes: SIGKILL a writer at random moments, reopen, verify.

Each child takes a new writer epoch (as a restarted controller does) and appends batches of
random sizes to the same SQLite file; after every acknowledged append it records the batch
number in an ack file. The parent kills it after a random delay. The kill lands at a random moment of the append loop (after
the child opened the store). After every kill: the chain
verifies, every acknowledged batch is present, and every batch present is complete.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import struct
import time

import pytest

from ledger import RolloutAssigned, open_store

KILLS = int(os.environ.get("RLX_CRASH_KILLS", "200"))
RUN = "crash"


def _writer(path: str, ack_path: str, seed: int, ready) -> None:
    rng = random.Random(seed)
    store = open_store(path)
    epoch = store.acquire_epoch(RUN)
    ready.set()
    head = store.head(RUN).seq
    batch = 0
    for s in store.read(RUN, max(1, head)):  # continue numbering after the last batch present
        batch = int(s.event.worker_id.split("/")[0]) + 1
    fd = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    while True:
        size = rng.choice((1, 2, 7, 30, 100))
        evs = [RolloutAssigned(f"{batch}/{size}", (batch * 1000 + i,), (i,)) for i in range(size)]
        head = store.append(RUN, evs, expected_seq=head, epoch=epoch).seq
        os.write(fd, struct.pack("<q", batch))
        batch += 1


class Checker:
    """Checks the log after each kill, incrementally from the last verified seq."""

    def __init__(self, path: str):
        self.path = path
        self.verified = 0  # seqs 1..verified passed the chain check
        self.batches: dict[int, list[tuple[int, int]]] = {}

    def check(self, acked: set[int], *, full: bool = False) -> int:
        with open_store(self.path) as store:
            start = 1 if full else self.verified + 1
            report = store.verify(RUN, from_seq=start) if store.head(RUN).seq >= start else None
            assert report is None or report.ok, report
            if full:
                self.batches = {}
            for s in store.read(RUN, start):
                b, size = (int(x) for x in s.event.worker_id.split("/"))
                self.batches.setdefault(b, []).append((s.event.attempts[0], size))
            head = store.head(RUN).seq
        self.verified = head
        assert sorted(self.batches) == list(range(len(self.batches))), "a batch is missing in the middle"
        for b, items in self.batches.items():
            size = items[0][1]
            assert [i for i, _ in items] == list(range(size)), f"partial batch {b}: {len(items)} of {size}"
        lost = acked - set(self.batches)
        assert not lost, f"acknowledged batches lost: {sorted(lost)[:10]}"
        return head


@pytest.mark.slow
def test_random_sigkills_lose_no_acknowledged_batch_and_leave_no_partial_one(tmp_path):
    path = str(tmp_path / "ledger.db")
    ack_path = str(tmp_path / "acks")
    with open_store(path, create=True) as store:
        store.create_run(RUN)
    open(ack_path, "wb").close()
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["ledger", "ledger.sql", "sqlalchemy", "numpy"])
    rng = random.Random(1234)
    acked: set[int] = set()
    grew = 0
    last_head = 0
    checker = Checker(path)
    for kill in range(KILLS):
        ready = ctx.Event()
        child = ctx.Process(target=_writer, args=(path, ack_path, kill, ready))
        child.start()
        assert ready.wait(30), "writer did not start"
        time.sleep(rng.uniform(0.0, 0.03))
        child.kill()  # SIGKILL: no cleanup, no flush, possibly mid-transaction
        child.join()
        assert child.exitcode == -9 or child.exitcode is not None
        with open(ack_path, "rb") as f:
            data = f.read()
        acked |= {v for (v,) in struct.iter_unpack("<q", data[: len(data) // 8 * 8])}
        head = checker.check(acked)
        grew += head > last_head
        last_head = head
    checker.check(acked, full=True)
    # The kills landed while work was in progress, not only before the first append.
    assert grew >= KILLS // 4, f"the writer made progress in only {grew} of {KILLS} lives"
    assert len(acked) > KILLS
