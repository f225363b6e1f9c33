"""params_digest: the documented byte layout, stability across processes, and sensitivity."""

from __future__ import annotations

import hashlib
import os
import pathlib
import struct
import subprocess
import sys

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.params import ParamStoreError, params_digest
from tests.runtime.params.writer import make_opt_state, make_params

_ROOT = pathlib.Path(__file__).resolve().parents[3]


def record(path: bytes, dtype: bytes, shape: tuple[int, ...], data: bytes) -> bytes:
    """One leaf record, spelled out from the layout in runtime/params/digest.py."""
    dims = b"".join(struct.pack("<Q", d) for d in shape)
    return (
        struct.pack("<I", len(path)) + path
        + struct.pack("<I", len(dtype)) + dtype
        + struct.pack("<I", len(shape)) + dims
        + hashlib.sha256(data).digest()
    )  # fmt: skip


def test_layout_matches_the_documented_bytes():
    tree = {"b": np.array([1, 2], np.int32), "a": np.float32(1.0), "c": {"d": np.array([1.0])}}
    tree["c"]["d"] = tree["c"]["d"].astype(ml_dtypes.bfloat16)
    expected = hashlib.sha256(
        b"rlx.params.sha256.v1\n"
        + struct.pack("<Q", 3)
        + record(b"a", b"float32", (), b"\x00\x00\x80\x3f")  # 1.0f = 0x3f800000
        + record(b"b", b"int32", (2,), b"\x01\x00\x00\x00\x02\x00\x00\x00")
        + record(b"c/d", b"bfloat16", (1,), b"\x80\x3f")  # bf16 1.0 = 0x3f80
    ).hexdigest()
    assert params_digest(tree) == expected
    # Pinned, so that a change of layout cannot pass unnoticed.
    assert expected == "8c7cef292ca7dd14f987d5c431244f2a4e34149dd31d4d1b8908ccd804d78a09"


def test_empty_tree_has_a_digest():
    expected = hashlib.sha256(b"rlx.params.sha256.v1\n" + bytes(8)).hexdigest()
    assert params_digest({}) == params_digest(None) == expected


@pytest.mark.slow
def test_stable_across_processes():
    params = make_params(3)
    state = make_opt_state(3, params)
    code = (
        "from tests.runtime.params.writer import make_params, make_opt_state\n"
        "from runtime.params import params_digest\n"
        "p = make_params(3)\n"
        "p = {k: p[k] for k in reversed(list(p))}\n"  # other insertion order
        "print(params_digest(p), params_digest(make_opt_state(3, p)))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "4321", "PYTHONPATH": str(_ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=_ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == [params_digest(params), params_digest(state)]


keys = st.text(alphabet="abcxyz_.", min_size=1, max_size=4)
leaves = st.builds(
    lambda n, seed: np.random.default_rng(seed).standard_normal(n).astype(np.float32),
    st.integers(0, 4),
    st.integers(0, 2**16),
)
nested = st.recursive(
    leaves, lambda children: st.dictionaries(keys, children, max_size=4), max_leaves=12
)


def reorder(tree, rng):
    if not isinstance(tree, dict):
        return tree
    items = list(tree.items())
    rng.shuffle(items)
    return {k: reorder(v, rng) for k, v in items}


@given(tree=nested, seed=st.integers(0, 2**16))
def test_independent_of_dict_insertion_order(tree, seed):
    assert params_digest(reorder(tree, np.random.default_rng(seed))) == params_digest(tree)


def test_independent_of_array_library_layout_and_byte_order():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    want = params_digest({"x": x})
    assert params_digest({"x": jnp.asarray(x)}) == want
    assert params_digest({"x": x.astype(">f4")}) == want
    assert params_digest({"x": np.asfortranarray(x)}) == want
    assert params_digest({"x": x.T.copy().T}) == want


def test_sensitive_to_every_bit_dtype_shape_and_name():
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    base = params_digest({"w": x})
    flipped = set()
    raw = x.view(np.uint8).reshape(-1)
    for i in range(raw.size * 8):
        y = raw.copy()
        y[i // 8] ^= np.uint8(1 << (i % 8))
        flipped.add(params_digest({"w": y.view(np.float32).reshape(2, 3)}))
    assert len(flipped) == raw.size * 8 and base not in flipped
    others = {
        params_digest({"w": x.view(np.int32)}),
        params_digest({"w": x.reshape(3, 2)}),
        params_digest({"v": x}),
        params_digest({"w": {"w": x}}),
    }
    assert len(others) == 4 and base not in others


def test_structure_type_is_not_part_of_the_digest():
    # The digest names paths, dtypes, shapes and bytes; a tuple and a list holding the same
    # leaves have the same paths ("0", "1"), so they have the same digest.
    a, b = np.ones(2, np.int32), np.zeros(1, np.float32)
    assert params_digest((a, b)) == params_digest([a, b])


def test_rejects_unsupported_dtype_naming_leaf():
    with pytest.raises(ParamStoreError, match="leaf 'opt/0' has dtype 'object'"):
        params_digest({"opt": (np.array([None]),)})
