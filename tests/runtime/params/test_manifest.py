"""The manifest codec: canonical bytes, and refusal of anything malformed or tampered with."""

from __future__ import annotations

import json

import numpy as np
import pytest

from runtime.params import Manifest, ParamStoreError, TreeManifest
from runtime.params import manifest as layout
from runtime.params.digest import canonical_leaves, combine, leaf_records
from runtime.params.tree import describe


def tree_manifest(tree) -> TreeManifest:
    records = leaf_records(canonical_leaves(tree))
    return TreeManifest(combine(records), records, describe(tree))


def example() -> Manifest:
    params = tree_manifest({"w": np.arange(3, dtype=np.float32), "b": np.int32(1)})
    opt = tree_manifest((np.int32(2), {"w": np.zeros(3, np.float32)}))
    data = layout.data_prefix(5, layout.content_id(params.digest, opt.digest))
    return Manifest(5, data, params, opt)


def test_round_trip_and_canonical_bytes():
    manifest = example()
    raw = manifest.encode()
    assert Manifest.decode(raw, version=5) == manifest
    assert raw == json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":")).encode()
    assert manifest.digest == manifest.params.digest


def test_keys_and_names():
    assert layout.manifest_key(12) == "manifests/v12.json"
    assert layout.parse_manifest_name("v12.json") == 12
    assert layout.parse_manifest_name("v012.json") is None
    assert layout.parse_manifest_name("v12.json.__lock") is None
    assert layout.pending_key("v3/0123456789abcdef/") == "pending/v3.0123456789abcdef"
    assert layout.parse_pending_name("v3.0123456789abcdef") == (3, "v3/0123456789abcdef/")
    assert layout.leaf_key("v3/x/", "params", "a/b") == "v3/x/params/a/b/"
    assert layout.leaf_key("v3/x/", "params", "") == "v3/x/params/"


def tampered(change) -> bytes:
    body = json.loads(example().encode())
    change(body)
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: b.update(format="other"), "format 'other'"),
        (lambda b: b.update(version=6), "it names version 6"),
        (lambda b: b.update(data="../../etc/"), "data prefix '../../etc/' is not v5/"),
        (lambda b: b["params"]["leaves"][0].__setitem__(0, "../x"), "leaf path '../x'"),
        (lambda b: b["params"]["leaves"][0].__setitem__(3, "0" * 64), "do not combine"),
        (lambda b: b["params"].update(digest="0" * 64), "do not combine"),
        (lambda b: b.pop("opt_state"), "opt_state"),
    ],
)
def test_malformed_manifests_are_refused(change, message):
    with pytest.raises(ParamStoreError, match=f"manifest of version 5 is malformed: .*{message}"):
        Manifest.decode(tampered(change), version=5)


def test_garbage_is_refused():
    with pytest.raises(ParamStoreError, match="manifest of version 0 is malformed"):
        Manifest.decode(b"\x00not json", version=0)
