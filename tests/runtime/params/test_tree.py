"""Leaf paths, and rebuilding trees from their stored structure."""

from __future__ import annotations

import collections
import json
from typing import NamedTuple

import jax
import numpy as np
import optax
import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.params import ParamStoreError
from runtime.params.tree import describe, escape_component, flatten, rebuild, rebuild_like


class Moments(NamedTuple):
    count: np.ndarray
    mu: dict
    nothing: None


@pytest.mark.parametrize(
    ("key", "component"),
    [
        ("kernel", "kernel"),
        ("Dense_0", "Dense_0"),
        ("layer-1", "layer-1"),
        ("layer.0", "layer%2E0"),
        ("a/b", "a%2Fb"),
        ("..", "%2E%2E"),
        ("%", "%25"),
        ("ü", "%C3%BC"),  # UTF-8 bytes c3 bc
    ],
)
def test_escape_component(key, component):
    assert escape_component(key) == component


@pytest.mark.parametrize(("key", "message"), [("", "is empty"), (3, "is a int; only str keys")])
def test_bad_keys_are_rejected(key, message):
    with pytest.raises(ParamStoreError, match=message):
        flatten({key: np.ones(1)})


def test_paths_of_an_optax_state():
    params = {"dense": {"kernel": np.ones((2, 2), np.float32)}}
    state = optax.chain(optax.clip(1.0), optax.adam(1e-3)).init(params)
    assert [path for path, _ in flatten(state)] == [
        "1/0/count",
        "1/0/mu/dense/kernel",
        "1/0/nu/dense/kernel",
    ]
    assert [path for path, _ in flatten(np.ones(2))] == [""]


def via_json(structure):
    """What a manifest stores and gives back."""
    return json.loads(json.dumps(structure))


def test_namedtuple_none_and_scalar_round_trip():
    tree = [Moments(np.int32(4), {"w": np.ones(2)}, None), (np.float32(1.5),), None]
    arrays = dict(flatten(tree))
    back = rebuild(via_json(describe(tree)), arrays)
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(tree)
    assert type(back[0]) is Moments and back[0].count == 4 and back[0].nothing is None


def test_opaque_nodes_need_a_template():
    tree = {"od": collections.OrderedDict(b=np.ones(1), a=np.zeros(1))}
    structure = via_json(describe(tree))
    assert structure["items"][0][1] == {"kind": "opaque", "type": "collections:OrderedDict"}
    with pytest.raises(
        ParamStoreError, match="OrderedDict node, which can only be restored with like="
    ):
        rebuild(structure, dict(flatten(tree)))
    back = rebuild_like(tree, dict(flatten(tree)))
    assert type(back["od"]) is collections.OrderedDict and list(back["od"]) == ["b", "a"]


def test_unimportable_namedtuple_needs_a_template():
    class Local(NamedTuple):  # its qualified name holds "<locals>": no import can find it
        x: np.ndarray

    tree = Local(np.ones(1))
    with pytest.raises(ParamStoreError, match="cannot import .*Local.*pass like="):
        rebuild(via_json(describe(tree)), dict(flatten(tree)))


def test_changed_namedtuple_fields_are_refused():
    structure = via_json(describe(Moments(np.int32(0), {}, None)))
    structure["fields"][0][0] = "step"
    with pytest.raises(ParamStoreError, match="is not a namedtuple with fields"):
        rebuild(structure, {"step": np.int32(0)})


keys = st.text(alphabet="ab.c/_", min_size=1, max_size=3)
leaf = st.builds(np.float32, st.integers(-3, 3))
trees = st.recursive(
    st.one_of(leaf, st.none()),
    lambda children: st.one_of(
        st.dictionaries(keys, children, max_size=3),
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
    ),
    max_leaves=10,
)


@given(tree=trees)
def test_rebuild_restores_structure_and_leaves(tree):
    pairs = flatten(tree)
    back = rebuild(via_json(describe(tree)), dict(pairs))
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(tree)
    again = flatten(back)
    assert [p for p, _ in again] == [p for p, _ in pairs]
    assert all(a.tobytes() == b.tobytes() for (_, a), (_, b) in zip(again, pairs, strict=True))
