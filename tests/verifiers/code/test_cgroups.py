"""A slot's cgroup limits on this host's real cgroup hierarchy: the kernel's values decide what is
written, so a slot directory that another sandbox of the same uid left with other limits gets the
limits asked for (raising and lowering, cgroup v1's memory+swap order included)."""

from __future__ import annotations

import os
import uuid

import pytest

from verifiers.code import cgroups

MIB = 1 << 20


@pytest.fixture
def hierarchies():
    found = cgroups.detect()
    if not any("memory" in h.controllers for h in found):
        pytest.skip("no writable cgroup memory controller on this host")
    return found


def _memory_limits(slot: cgroups.SlotCgroup) -> tuple[int, ...]:
    version, d = next((v, by["memory"]) for v, by in slot.dirs.items() if "memory" in by)
    names = ("memory.max",) if version == 2 else ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
    return tuple(int(open(os.path.join(d, n), encoding="ascii").read()) for n in names
                 if os.path.exists(os.path.join(d, n)))


def test_two_sandboxes_of_one_slot_each_get_the_limits_they_ask_for(hierarchies):
    name = f"rlx-test-{uuid.uuid4().hex[:8]}"
    first = cgroups.SlotCgroup(hierarchies, name)
    try:
        first.prepare(256 * MIB, 8)
        assert set(_memory_limits(first)) == {256 * MIB}
        second = cgroups.SlotCgroup(hierarchies, name)  # the same directory, another sandbox
        second.prepare(512 * MIB, 8)  # raising past the first's memory+swap limit
        assert set(_memory_limits(second)) == {512 * MIB}
        first.prepare(256 * MIB, 8)  # the first's own earlier value is no longer the kernel's
        assert set(_memory_limits(first)) == {256 * MIB}
    finally:
        for by in first.dirs.values():
            for d in set(by.values()):
                os.rmdir(d)
