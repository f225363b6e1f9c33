"""Pytrees as (leaf path, array) pairs, and a JSON description of their structure.

A *leaf path* names a leaf by the keys on the way to it from the root — dict keys, namedtuple
field names and sequence indices — each escaped and joined by ``/``. Escaping keeps ASCII
letters, digits, ``_`` and ``-`` and writes every other UTF-8 byte as ``%XX`` (upper-case hex).
A path is therefore ASCII, has no empty, ``.`` or ``..`` component, and distinct keys give
distinct paths, so a path is both a stable name for hashing and a safe key-value-store prefix.
A tree that is a single leaf has the empty path ``""``.

A *structure* is a JSON value that lets ``rebuild`` restore a tree without a template. Nodes:

    {"kind": "leaf"}
    {"kind": "none"}
    {"kind": "dict", "items": [[key, node], ...]}              (keys sorted, as JAX does)
    {"kind": "tuple" | "list", "items": [node, ...]}
    {"kind": "namedtuple", "class": "module:qualname", "fields": [[name, node], ...]}
    {"kind": "opaque", "type": "module:qualname"}               (any other pytree node)

Flax parameters (nested dicts) and optax states (namedtuples, tuples, dicts, scalar arrays)
round-trip through ``rebuild``. An ``opaque`` node (a registered custom node, an
``OrderedDict``) is stored but can only be restored with ``rebuild_like`` and a template.
Leaves are returned as numpy arrays; a Python scalar leaf comes back as a 0-d array.
"""

from __future__ import annotations

import importlib
import string
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from runtime.params.errors import ParamStoreError

_SAFE = frozenset((string.ascii_letters + string.digits + "_-").encode())

Structure = dict[str, Any]


def escape_component(key: str) -> str:
    """Escape one key for use as a path component (see the module docstring)."""
    if not isinstance(key, str):
        raise ParamStoreError(
            f"pytree dict key {key!r} is a {type(key).__name__}; only str keys are accepted"
        )
    if not key:
        raise ParamStoreError("pytree dict key '' is empty; keys must be non-empty strings")
    return "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in key.encode())


def _component(entry: Any) -> str:
    if isinstance(entry, jax.tree_util.DictKey):
        return escape_component(entry.key)
    if isinstance(entry, jax.tree_util.GetAttrKey):
        return escape_component(entry.name)
    if isinstance(entry, jax.tree_util.SequenceKey):
        return str(entry.idx)
    if isinstance(entry, jax.tree_util.FlattenedIndexKey):
        return str(entry.key)
    raise ParamStoreError(f"pytree key {entry!r} of type {type(entry).__name__} is not supported")


def path_string(key_path: tuple[Any, ...]) -> str:
    """The leaf path of a JAX key path."""
    return "/".join(_component(entry) for entry in key_path)


def leaves(tree: Any) -> tuple[tuple[str, Any], ...]:
    """The (leaf path, leaf) pairs of ``tree``, in JAX flattening order, leaves as they are."""
    return tuple((path_string(key_path), leaf) for key_path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0])


def flatten(tree: Any) -> tuple[tuple[str, np.ndarray], ...]:
    """The (leaf path, numpy array) pairs of ``tree``, in JAX flattening order."""
    return tuple((path, np.asarray(leaf)) for path, leaf in leaves(tree))


def _type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _is_namedtuple(node: Any) -> bool:
    return isinstance(node, tuple) and hasattr(type(node), "_fields")


def describe(tree: Any) -> Structure:
    """The structure of ``tree`` as a JSON value (see the module docstring)."""
    if tree is None:
        return {"kind": "none"}
    cls = type(tree)
    if cls is dict:
        for key in tree:
            escape_component(key)
        return {"kind": "dict", "items": [[k, describe(tree[k])] for k in sorted(tree)]}
    if cls in (tuple, list):
        return {"kind": cls.__name__, "items": [describe(child) for child in tree]}
    if _is_namedtuple(tree):
        fields = [[name, describe(getattr(tree, name))] for name in cls._fields]
        return {"kind": "namedtuple", "class": _type_name(cls), "fields": fields}
    treedef = jax.tree_util.tree_structure(tree)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1:  # type: ignore[attr-defined]  # jaxlib has no stub for PyTreeDef
        return {"kind": "leaf"}
    return {"kind": "opaque", "type": _type_name(cls)}


def _load_namedtuple(name: str, field_names: list[str]) -> type:
    module_name, _, qualname = name.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for attr in qualname.split("."):
            obj = getattr(obj, attr)
    except (ImportError, AttributeError) as e:
        raise ParamStoreError(
            f"cannot import the namedtuple class {name} of a stored tree ({e}); "
            "pass like= with a template tree instead"
        ) from e
    if (
        not (isinstance(obj, type) and issubclass(obj, tuple))
        or list(getattr(obj, "_fields", ())) != field_names
    ):
        raise ParamStoreError(
            f"{name} is not a namedtuple with fields {field_names}; "
            "pass like= with a template tree instead"
        )
    return obj


def rebuild(structure: Structure, arrays: Mapping[str, np.ndarray], prefix: str = "") -> Any:
    """Restore a tree from its ``structure`` and its leaves keyed by leaf path."""

    def child(component: str) -> str:
        return f"{prefix}/{component}" if prefix else component

    kind = structure["kind"]
    if kind == "leaf":
        return arrays[prefix]
    if kind == "none":
        return None
    if kind == "dict":
        return {
            k: rebuild(node, arrays, child(escape_component(k))) for k, node in structure["items"]
        }
    if kind in ("tuple", "list"):
        items = [rebuild(node, arrays, child(str(i))) for i, node in enumerate(structure["items"])]
        return tuple(items) if kind == "tuple" else items
    if kind == "namedtuple":
        names = [name for name, _ in structure["fields"]]
        cls = _load_namedtuple(structure["class"], names)
        return cls(
            *(rebuild(node, arrays, child(escape_component(n))) for n, node in structure["fields"])
        )
    if kind == "opaque":
        raise ParamStoreError(
            f"the stored tree holds a {structure['type']} node, which can only be restored "
            "with like= and a template tree"
        )
    raise ParamStoreError(f"unknown pytree node kind {kind!r} in a stored structure")


def rebuild_like(template: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    """Restore a tree with the structure of ``template`` from leaves keyed by leaf path.

    The template's leaves may be arrays or ``jax.ShapeDtypeStruct``; where they carry a shape
    and dtype, those must match the stored ones.
    """
    key_paths, treedef = jax.tree_util.tree_flatten_with_path(template)
    wanted = [path_string(key_path) for key_path, _ in key_paths]
    missing = sorted(set(wanted) - set(arrays))
    extra = sorted(set(arrays) - set(wanted))
    if missing or extra:
        raise ParamStoreError(
            "template does not match the stored tree: "
            f"leaves only in the template {missing[:5]}, only in the store {extra[:5]}"
        )
    leaves = []
    for path, (_, leaf) in zip(wanted, key_paths, strict=True):
        stored = arrays[path]
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        if shape is not None and tuple(shape) != stored.shape:
            raise ParamStoreError(
                f"leaf {path!r}: template shape {tuple(shape)}, stored shape {stored.shape}"
            )
        if dtype is not None and np.dtype(dtype) != stored.dtype:
            raise ParamStoreError(
                f"leaf {path!r}: template dtype {np.dtype(dtype).name}, "
                f"stored dtype {stored.dtype.name}"
            )
        leaves.append(stored)
    return jax.tree_util.tree_unflatten(treedef, leaves)
