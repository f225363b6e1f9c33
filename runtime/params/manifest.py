"""The store's key layout and the manifest that publishes a version.

Layout under the store root (every key relative to it)::

    manifests/v{N}.json        the manifest; version N exists if and only if this key does
    pending/v{N}.{C}           empty; the data under v{N}/{C}/ may be unpublished or orphaned
    v{N}/{C}/params/{leaf}/    one zarr3 array per parameter leaf of at least PACKED_LEAF_BYTES
    v{N}/{C}/opt_state/{leaf}/ one zarr3 array per such optimizer-state leaf
    v{N}/{C}/packed/{tree}/    one uint8 zarr3 array holding the tree's smaller leaves

The smaller leaves of a tree (norm scales, biases, a small model's every weight) are packed into
one array, each leaf's little-endian element bytes in turn, at offsets that are multiples of
``PACK_ALIGN``, in the order the manifest lists them (``TreeManifest.packed``): one array per
tree instead of one per leaf is a few files to write, sync and delete per version instead of
hundreds, which is most of what storing a small model's version costs.

``C`` is a content id (16 hex digits) of the parameter and optimizer-state digests, so two
attempts to write different contents for one version never share arrays. The manifest is
written last and only if absent (a conditional write), so a reader sees a version whole or not
at all, and a crash mid-write leaves only data that no manifest names, which
``ParamStore.sweep`` removes.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from runtime.params.digest import LeafRecord, combine
from runtime.params.errors import ParamStoreError
from runtime.params.tree import Structure

MANIFEST_FORMAT = "rlx.params.manifest.v2"
READABLE_FORMATS = ("rlx.params.manifest.v1", MANIFEST_FORMAT)  # v1: no packed leaves
PACK_ALIGN = 64
MANIFESTS = "manifests/"
PENDING = "pending/"
TREES = ("params", "opt_state")

_MANIFEST_NAME = re.compile(r"v(0|[1-9][0-9]*)\.json")
_DATA_PREFIX = re.compile(r"v(0|[1-9][0-9]*)/[0-9a-f]{16}/")
_LEAF_PATH = re.compile(r"([A-Za-z0-9_%-]+(/[A-Za-z0-9_%-]+)*)?")
_PENDING_NAME = re.compile(r"(v(?:0|[1-9][0-9]*))\.([0-9a-f]{16})")


def manifest_key(version: int) -> str:
    """The key of version ``version``'s manifest."""
    return f"{MANIFESTS}v{version}.json"


def content_id(params_digest: str, opt_state_digest: str | None) -> str:
    """16 hex digits naming the contents of a version: its two tree digests."""
    text = f"{params_digest}\n{opt_state_digest or '-'}".encode("ascii")
    return hashlib.sha256(text).hexdigest()[:16]


def data_prefix(version: int, content: str) -> str:
    """The key prefix under which the arrays of one (version, contents) are written."""
    return f"v{version}/{content}/"


def pending_key(data: str) -> str:
    """The marker key that says the arrays under ``data`` may not be published."""
    return PENDING + data.rstrip("/").replace("/", ".")


def leaf_key(data: str, tree: str, path: str) -> str:
    """The key prefix of one leaf's zarr3 array."""
    return f"{data}{tree}/{path}/" if path else f"{data}{tree}/"


def pack_key(data: str, tree: str) -> str:
    """The key prefix of the zarr3 array that packs ``tree``'s small leaves."""
    return f"{data}packed/{tree}/"


def pack_offsets(records: Sequence[LeafRecord]) -> tuple[list[int], int]:
    """The byte offset of each packed leaf (``records`` in pack order) and the pack's size."""
    offsets, end = [], 0
    for record in records:
        start = -(-end // PACK_ALIGN) * PACK_ALIGN
        offsets.append(start)
        end = start + record.nbytes
    return offsets, end


def parse_manifest_name(name: str) -> int | None:
    """The version of a key under ``manifests/``, or ``None`` for a foreign key."""
    match = _MANIFEST_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def parse_pending_name(name: str) -> tuple[int, str] | None:
    """(version, data prefix) of a key under ``pending/``, or ``None`` for a foreign key."""
    match = _PENDING_NAME.fullmatch(name)
    if not match:
        return None
    return int(match.group(1)[1:]), f"{match.group(1)}/{match.group(2)}/"


@dataclass(frozen=True)
class TreeManifest:
    """One stored tree: its digest, the records of its leaves, its structure, and the paths of
    the leaves packed into its ``pack_key`` array, in pack order (a subsequence of ``leaves``)."""

    digest: str
    leaves: tuple[LeafRecord, ...]
    structure: Structure
    packed: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "leaves": [[r.path, r.dtype, list(r.shape), r.sha256] for r in self.leaves],
            "structure": self.structure,
            "packed": list(self.packed),
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> TreeManifest:
        leaves = tuple(
            LeafRecord(str(path), str(dtype), tuple(int(d) for d in shape), str(sha))
            for path, dtype, shape, sha in value["leaves"]
        )
        packed = tuple(str(path) for path in value.get("packed", ()))
        return cls(str(value["digest"]), leaves, value["structure"], packed)

    def packed_records(self) -> tuple[LeafRecord, ...]:
        """The records of the packed leaves, in pack order."""
        by_path = {r.path: r for r in self.leaves}
        return tuple(by_path[path] for path in self.packed)

    def check(self) -> None:
        """Raise if the leaf records do not combine to the recorded digest, or the packed paths
        are not distinct leaves of the tree."""
        if combine(self.leaves) != self.digest:
            raise ParamStoreError(f"leaf records do not combine to digest {self.digest}")
        paths = {r.path for r in self.leaves}
        if len(set(self.packed)) != len(self.packed) or not paths.issuperset(self.packed):
            raise ParamStoreError("packed leaves are not distinct leaves of the tree")


@dataclass(frozen=True)
class Manifest:
    """The publish record of one version; ``data`` is the key prefix of its arrays."""

    version: int
    data: str
    params: TreeManifest
    opt_state: TreeManifest | None

    @property
    def digest(self) -> str:
        """The version's digest: that of its parameters (optimizer state has its own)."""
        return self.params.digest

    def tree(self, name: str) -> TreeManifest | None:
        return self.params if name == "params" else self.opt_state

    def encode(self) -> bytes:
        """Canonical JSON: sorted keys, no whitespace, ASCII."""
        body = {
            "format": MANIFEST_FORMAT,
            "version": self.version,
            "data": self.data,
            "params": self.params.to_json(),
            "opt_state": None if self.opt_state is None else self.opt_state.to_json(),
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode("ascii")

    @classmethod
    def decode(cls, raw: bytes, *, version: int) -> Manifest:
        """Parse and check the manifest stored under ``manifest_key(version)``."""
        try:
            body = json.loads(raw)
            if body.get("format") not in READABLE_FORMATS:
                raise ValueError(f"format {body.get('format')!r}, expected one of {READABLE_FORMATS}")
            if body["version"] != version:
                raise ValueError(f"it names version {body['version']}")
            opt_state = body["opt_state"]
            manifest = cls(
                version=version,
                data=str(body["data"]),
                params=TreeManifest.from_json(body["params"]),
                opt_state=None if opt_state is None else TreeManifest.from_json(opt_state),
            )
            match = _DATA_PREFIX.fullmatch(manifest.data)
            if not match or int(match.group(1)) != version:
                raise ValueError(f"data prefix {manifest.data!r} is not v{version}/<16 hex>/")
            for tree in (manifest.params, manifest.opt_state):
                if tree is not None:
                    for record in tree.leaves:
                        if not _LEAF_PATH.fullmatch(record.path):
                            raise ValueError(f"leaf path {record.path!r} is not an escaped path")
                    tree.check()
        except (ValueError, KeyError, TypeError, AttributeError, ParamStoreError) as e:
            raise ParamStoreError(f"manifest of version {version} is malformed: {e}") from e
        return manifest
