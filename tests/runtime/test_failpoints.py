"""RLX_FAILPOINTS: the accepted forms, and what a ``raise`` point does on each reach."""

from __future__ import annotations

import errno

import pytest

from runtime import failpoints
from runtime.errors import UsageError


def test_the_accepted_forms_parse_and_bad_ones_name_the_item():
    assert failpoints._parse("trainer.step@2, inference.generate@1:sleep=3,ledger.snapshot@4:raise=2") == {
        "trainer.step": (2, None, 0), "inference.generate": (1, 3.0, 0), "ledger.snapshot": (4, None, 2)}
    for bad in ["x", "x@0", "x@1:raise=0", "x@1:raise=-1", "x@1:raise=y", "x@1:raise=1000001", "x@1:sleep=601",
                "x@1:boom=1"]:
        with pytest.raises(UsageError, match=f"item {bad!r} is not accepted"):
            failpoints._parse(bad)


def test_a_raise_point_raises_an_io_error_on_the_armed_reaches_only(monkeypatch):
    monkeypatch.setattr(failpoints, "_ARMED", failpoints._parse("p@2:raise=2"))
    monkeypatch.setattr(failpoints, "_SEEN", {})
    outcomes = []
    for _ in range(5):
        try:
            failpoints.failpoint("p")
            outcomes.append(None)
        except OSError as e:
            outcomes.append((e.errno, e.strerror))
    assert outcomes == [None, (errno.EIO, "failpoint p (reach 2)"), (errno.EIO, "failpoint p (reach 3)"), None, None]
    failpoints.failpoint("other")  # not armed: nothing happens
