"""The parameter server: versioned pytrees of arrays in TensorStore, one zarr3 array per leaf.

``put`` writes a version's arrays under a fresh prefix, then publishes the version by writing
its manifest last, on the condition that no manifest exists yet (see ``manifest.py`` for the
layout). Readers list and read manifests only, so any number of them may run while a version
is written, and a writer killed at any point leaves no half version: only unpublished data,
invisible to readers and removed by ``sweep``. Every read checks every leaf against the
sha256 recorded at publication.

Concurrency contract: readers anywhere; one writer (the trainer's ``put``: with a trainer gang,
its ranks each write their own shards and rank 0 alone the manifest) and one retention
caller (the controller's shell: ``delete`` of the versions the ledger retired, ``sweep``). ``sweep``
must not run while a ``put`` is in flight, since it cannot tell in-flight data from a crash's.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorstore as ts

from runtime.failpoints import failpoint
from runtime.params import manifest as layout
from runtime.params.digest import canonical, canonical_leaves, combine, data_sha256s, leaf_records, numpy_dtype
from runtime.params.errors import DigestMismatch, ParamStoreError
from runtime.params.location import Location, parse_location
from runtime.params.manifest import Manifest, TreeManifest
from runtime.params.tree import describe, rebuild, rebuild_like
from runtime.params.tree import leaves as leaves_with_paths

# One context per process: ``memory://`` stores live in it, so every ParamStore of the process
# opened on the same memory URL sees the same data (like a process-wide tmpfs).
_PROCESS_CONTEXT = ts.Context()

# Chunk keys "c.0.1" rather than "c/0/1": one directory per leaf on a file store, not one per
# chunk row; fewer directories make eviction several times faster.
_METADATA = {"chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}}}


def _check_version(version: Any) -> int:
    if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or version < 0:
        raise ParamStoreError(f"version {version!r} is not accepted; versions are ints >= 0")
    return int(version)


def _describe_versions(versions: Sequence[int]) -> str:
    if not versions:
        return "the store is empty"
    if len(versions) <= 12:
        return "available: " + ", ".join(map(str, versions))
    head, tail = ", ".join(map(str, versions[:3])), ", ".join(map(str, versions[-5:]))
    return f"available: {head}, …, {tail} ({len(versions)} versions)"


def _prefix_range(prefix: str) -> ts.KvStore.KeyRange:
    return ts.KvStore.KeyRange(prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1))


def _stored(manifest: Manifest, tree: str) -> TreeManifest:
    """The manifest's record of ``tree``: callers name only trees the manifest holds."""
    stored = manifest.tree(tree)
    assert stored is not None
    return stored


PACKED_LEAF_BYTES = 1 << 20
"""Leaves smaller than this are packed into one array per tree (``manifest.py``)."""


def _tree_manifest(
    leaves: Sequence[tuple[str, np.ndarray]], structure: Any, pack_below: int
) -> TreeManifest:
    records = leaf_records(leaves)
    packed = tuple(path for path, array in leaves if array.nbytes < pack_below)
    return TreeManifest(combine(records), records, structure, packed)


def _pack(leaves: Sequence[tuple[str, np.ndarray]], tree: TreeManifest) -> np.ndarray:
    """The packed leaves' bytes at their ``pack_offsets``, as one uint8 array."""
    arrays = dict(leaves)
    offsets, size = layout.pack_offsets(tree.packed_records())
    buffer = np.zeros(size, np.uint8)
    for path, offset in zip(tree.packed, offsets, strict=True):
        data = arrays[path].reshape(-1).view(np.uint8)  # canonical: little-endian, C order
        buffer[offset : offset + data.size] = data
    return buffer


def _layout_tree(
    data: str, tree: str, leaves: Sequence[tuple[str, np.ndarray]], stored: TreeManifest
) -> tuple[list[tuple[str, str]], list[tuple[str, np.ndarray]]]:
    """Where a tree's arrays go: ``(key, leaf path)`` of each leaf stored as an array of its own,
    and ``[(key, the packed bytes)]`` of its pack (empty when nothing is packed)."""
    packed = set(stored.packed)
    own = [(layout.leaf_key(data, tree, path), path) for path, _ in leaves if path not in packed]
    return own, [(layout.pack_key(data, tree), _pack(leaves, stored))] if packed else []


def _unpack(buffer: np.ndarray, tree: TreeManifest) -> dict[str, np.ndarray]:
    """The packed leaves of ``tree`` from its pack's bytes (views of ``buffer``)."""
    records = tree.packed_records()
    offsets, size = layout.pack_offsets(records)
    if buffer.dtype != np.uint8 or buffer.shape != (size,):
        raise ValueError(f"the packed leaves are {buffer.dtype}{list(buffer.shape)}, not uint8[{size}]")
    out = {}
    for record, offset in zip(records, offsets, strict=True):
        data = buffer[offset : offset + record.nbytes]
        out[record.path] = data.view(numpy_dtype(record.dtype)).reshape(record.shape)
    return out


class ParamStore:
    """A versioned parameter store at one URL. Create with ``ParamStore.open``."""

    def __init__(
        self, location: Location, context: ts.Context, kv: ts.KvStore, pack_below: int = PACKED_LEAF_BYTES
    ) -> None:
        self._location = location
        self._context = context
        self._kv = kv
        self._pack_below = pack_below

    @classmethod
    def open(
        cls, url: str, *, create: bool = False, context: ts.Context | None = None,
        pack_below: int = PACKED_LEAF_BYTES,
    ) -> ParamStore:
        """Open the store at ``url`` (``file://``, ``memory://`` or a local path).

        Args:
            url: where the store lives; see ``runtime.params.location.parse_location``.
            create: create a missing local directory instead of failing.
            context: TensorStore context; the process-wide one by default.
            pack_below: leaves of fewer bytes that this store's ``put`` packs into one array
                per tree (0: none). Readers read either layout.

        Unpublished data of a crashed ``put`` is ignored; the single writer removes it with
        ``sweep``.
        """
        location = parse_location(url)
        directory = location.directory
        if directory is not None and not os.path.isdir(directory):
            if os.path.exists(directory):
                raise ParamStoreError(f"parameter store path {directory} is not a directory")
            if not create:
                raise ParamStoreError(
                    f"parameter store directory {directory} does not exist; "
                    "create it or open with create=True"
                )
            os.makedirs(directory, exist_ok=True)
        ctx = context if context is not None else _PROCESS_CONTEXT
        kv = cls._await(ts.KvStore.open(location.kvstore(), context=ctx), f"opening {url}")
        return cls(location, ctx, kv, pack_below)

    @property
    def url(self) -> str:
        return self._location.url

    @property
    def context(self) -> ts.Context:
        """The TensorStore context of the store (``memory://`` data lives in it)."""
        return self._context

    def __repr__(self) -> str:
        return f"ParamStore({self.url!r})"

    # -- reading ------------------------------------------------------------------------------

    def versions(self) -> tuple[int, ...]:
        """The published versions, ascending."""
        names = self._list(layout.MANIFESTS)
        return tuple(sorted(v for v in map(layout.parse_manifest_name, names) if v is not None))

    def latest(self) -> int | None:
        """The newest published version, or ``None`` if the store is empty."""
        versions = self.versions()
        return versions[-1] if versions else None

    def manifest(self, version: int) -> Manifest:
        """The manifest of a published version."""
        version = _check_version(version)
        raw = self._read_key(layout.manifest_key(version))
        if raw is None:
            raise ParamStoreError(
                f"version {version} is not in the parameter store {self.url} "
                f"({_describe_versions(self.versions())})"
            )
        return Manifest.decode(raw, version=version)

    def digest(self, version: int) -> str:
        """The digest of a version's parameters (``params_digest`` of what ``put`` got)."""
        return self.manifest(version).digest

    def get(self, version: int, *, like: Any = None) -> Any:
        """The parameters of ``version``, with every leaf checked against its digest.

        Args:
            version: a published version.
            like: optional template tree (arrays or ``jax.ShapeDtypeStruct`` leaves) whose
                structure the result takes; by default the stored structure is rebuilt.

        Returns:
            The tree with numpy array leaves, bit-identical to what ``put`` was given.
        """
        return self._get_tree(self.manifest(version), "params", like)

    def get_opt_state(self, version: int, *, like: Any = None) -> Any:
        """The optimizer state stored with ``version``; ``like`` as in ``get``."""
        manifest = self.manifest(version)
        if manifest.opt_state is None:
            raise ParamStoreError(f"version {version} was stored without optimizer state")
        return self._get_tree(manifest, "opt_state", like)

    def verify(self, version: int) -> str:
        """Read every leaf of ``version`` and check it against the manifest (I8).

        Returns:
            The version's digest. Raises ``DigestMismatch`` naming the first bad leaf.
        """
        manifest = self.manifest(version)
        for tree in layout.TREES:
            if manifest.tree(tree) is not None:
                self._read_arrays(manifest, tree)
        return manifest.digest

    # -- writing ------------------------------------------------------------------------------

    def put(self, version: int, params: Any, opt_state: Any = None, *, gang: Any = None) -> str:
        """Write and publish ``version``; returns its digest (``params_digest(params)``).

        Versions are immutable: putting a version again with the same contents is a no-op
        that returns the digest (so a retried step is harmless); different contents raise.

        ``gang`` (``runtime.trainer.gang.Gang``): every rank of a trainer gang calls ``put``
        with its global arrays; each writes its own shards of the leaves stored as arrays of
        their own (chunked by the shards), rank 0 the packed leaves and, once every rank has
        written, the manifest. Every rank returns the digest.
        """
        version = _check_version(version)
        whole = (params, opt_state) if gang is None else gang.gather((params, opt_state))
        trees = {"params": canonical_leaves(whole[0])}
        params_tree = _tree_manifest(trees["params"], describe(whole[0]), self._pack_below)
        opt_tree = None
        if opt_state is not None:
            trees["opt_state"] = canonical_leaves(whole[1])
            opt_tree = _tree_manifest(trees["opt_state"], describe(whole[1]), self._pack_below)
        content = layout.content_id(params_tree.digest, None if opt_tree is None else opt_tree.digest)
        data = layout.data_prefix(version, content)
        manifest = Manifest(version, data, params_tree, opt_tree)

        key = layout.manifest_key(version)
        # With a gang every rank reads this before the first barrier and rank 0 publishes only
        # after the last, so all ranks take the same branch.
        existing = self._await(self._kv.read(key), f"reading {key}")
        if existing.state == "value":
            return self._same_or_raise(manifest, existing.value)
        if gang is None:
            self._write_key(layout.pending_key(data), b"")
            for name, tree_leaves in trees.items():
                self._write_tree(data, name, tree_leaves, _stored(manifest, name))
        else:
            self._write_shards(data, {"params": params, "opt_state": opt_state}, trees, manifest, gang)
            if not gang.leader:
                return manifest.digest
        failpoint("params.put")
        stamp = self._await(
            self._kv.write(key, manifest.encode(), if_equal=existing.stamp.generation),
            f"publishing version {version}",
        )
        if not stamp.generation:  # another writer published this version first
            return self._same_or_raise(manifest, self._read_key(key) or b"")
        self._write_key(layout.pending_key(data), None)
        return manifest.digest

    def _write_shards(self, data: str, arrays: dict[str, Any], trees: Mapping[str, Sequence[tuple[str, np.ndarray]]],
                      manifest: Manifest, gang: Any) -> None:
        """A gang's writes of one version (see ``put``): rank 0 creates every array and writes
        the packs; then each rank writes its shards of the other leaves."""
        what = f"writing {data} in {self.url}"
        own = []  # (key, the global array) of each leaf not packed
        packs = []
        for name, tree_leaves in trees.items():
            keys, pack = _layout_tree(data, name, tree_leaves, _stored(manifest, name))
            global_leaves = dict(leaves_with_paths(arrays[name]))
            own += [(key, global_leaves[path]) for key, path in keys]
            packs += pack
        if gang.leader:
            self._write_key(layout.pending_key(data), b"")
            self._write_arrays(packs, what)
            for key, array in own:
                self._await(self._open_array(key, np.dtype(array.dtype), array.shape,
                                             array.sharding.shard_shape(array.shape), create=True), what)
        gang.barrier("params.created")
        writes = []
        for key, array in own:
            stored_array = self._await(self._open_array(key, np.dtype(array.dtype), array.shape), what)
            for index, shard in gang.own_shards(array):
                writes.append(stored_array[index].write(canonical(key, shard)))
        for write in writes:
            self._await(write, what)
        gang.barrier("params.written")

    def _open_array(self, key: str, dtype: np.dtype, shape: tuple[int, ...], chunks: tuple[int, ...] | None = None,
                    *, create: bool = False) -> Any:
        metadata = dict(_METADATA)
        if chunks is not None:
            metadata["chunk_grid"] = {"name": "regular", "configuration": {"chunk_shape": list(chunks)}}
        return ts.open({**self._array_spec(key), "metadata": metadata}, create=create, open=True,
                       dtype=ts.dtype(dtype.name), shape=shape, context=self._context)

    # -- retention ----------------------------------------------------------------------------

    def delete(self, version: int) -> None:
        """Remove ``version`` (the ledger's ``VersionsRetired`` decides which, keeping I5)."""
        self._evict(self.manifest(_check_version(version)))

    def unpublished(self) -> tuple[str, ...]:
        """Data prefixes that no manifest publishes: a ``put`` in flight, or a crash's leftovers."""
        return tuple(sorted(data for _, data, published in self._pending() if not published))

    def sweep(self) -> tuple[str, ...]:
        """Remove data that no manifest publishes (left by a killed ``put`` or eviction).

        Returns:
            The removed data prefixes. Call only while no ``put`` is in flight.
        """
        removed = []
        for marker, data, published in self._pending():
            if not published:
                self._delete_prefix(data)
                removed.append(data)
            self._write_key(marker, None)
        directory = self._location.directory
        if directory is not None:  # a marker's or a manifest's write killed midway leaves its temporary
            for keys in (layout.PENDING, layout.MANIFESTS):
                _remove_lock_files(os.path.join(directory, keys))
        return tuple(sorted(removed))

    def leaf_spec(self, version: int, path: str, *, tree: str = "params") -> dict[str, Any]:
        """The TensorStore spec of one stored leaf, for readers that open arrays directly.

        Such a reader (e.g. one that reads a slice of a large leaf) opens the spec with
        ``context=store.context`` and bypasses the digest check. ``path`` is a leaf path of
        ``runtime.params.tree``; ``tree`` is ``params`` or ``opt_state``.
        """
        manifest = self.manifest(version)
        stored = manifest.tree(tree) if tree in layout.TREES else None
        if stored is None or path not in {record.path for record in stored.leaves}:
            raise ParamStoreError(f"version {version} has no {tree} leaf {path!r}")
        if path in stored.packed:
            raise ParamStoreError(
                f"version {version}'s {tree} leaf {path!r} is packed with the tree's other small "
                "leaves (a store opened with pack_below=0 writes one array per leaf); read it with get()"
            )
        return self._array_spec(layout.leaf_key(manifest.data, tree, path))

    # -- internals ----------------------------------------------------------------------------

    @staticmethod
    def _await(future: Any, what: str) -> Any:
        try:
            return future.result()
        except ValueError as e:
            raise ParamStoreError(f"{what}: {e}") from e

    def _read_key(self, key: str) -> bytes | None:
        result = self._await(self._kv.read(key), f"reading {key} in {self.url}")
        return result.value if result.state == "value" else None

    def _write_key(self, key: str, value: bytes | None) -> None:
        self._await(self._kv.write(key, value), f"writing {key} in {self.url}")

    def _list(self, prefix: str) -> list[str]:
        future = self._kv.list(_prefix_range(prefix), strip_prefix_length=len(prefix))
        return [key.decode() for key in self._await(future, f"listing {prefix} in {self.url}")]

    def _pending(self) -> list[tuple[str, str, bool]]:
        """(marker key, data prefix, whether a manifest publishes it) of each pending marker."""
        pending = []
        for name in self._list(layout.PENDING):
            parsed = layout.parse_pending_name(name)
            if parsed is not None:
                version, data = parsed
                raw = self._read_key(layout.manifest_key(version))
                published = raw is not None and Manifest.decode(raw, version=version).data == data
                pending.append((layout.PENDING + name, data, published))
        return pending

    def _array_spec(self, key: str) -> dict[str, Any]:
        return {"driver": "zarr3", "kvstore": self._location.kvstore(key)}

    def _write_tree(
        self, data: str, tree: str, leaves: Sequence[tuple[str, np.ndarray]], stored: TreeManifest
    ) -> None:
        """Write one tree's arrays: each leaf that is not packed, then the pack (if any)."""
        own, pack = _layout_tree(data, tree, leaves, stored)
        arrays = dict(leaves)
        self._write_arrays([(key, arrays[path]) for key, path in own] + pack,
                           f"writing {tree} under {data} in {self.url}")

    def _write_arrays(self, arrays: Sequence[tuple[str, np.ndarray]], what: str) -> None:
        """Create and write one zarr3 array under each key, all at once."""
        opening = [self._open_array(key, array.dtype, array.shape, create=True) for key, array in arrays]
        writes = [self._await(f, what).write(a) for f, (_, a) in zip(opening, arrays, strict=True)]
        for write in writes:
            self._await(write, what)

    def _get_tree(self, manifest: Manifest, tree: str, like: Any) -> Any:
        arrays = self._read_arrays(manifest, tree)
        if like is not None:
            return rebuild_like(like, arrays)
        return rebuild(_stored(manifest, tree).structure, arrays)

    def _read_arrays(self, manifest: Manifest, tree: str) -> dict[str, np.ndarray]:
        stored = _stored(manifest, tree)
        records = stored.leaves
        packed = set(stored.packed)
        keys = [layout.leaf_key(manifest.data, tree, r.path) for r in records if r.path not in packed]
        if packed:
            keys.append(layout.pack_key(manifest.data, tree))
        try:
            opened = [ts.open(self._array_spec(key), open=True, context=self._context) for key in keys]
            reads = [future.result().read() for future in opened]
            read = [r.result() for r in reads]
            by_path = _unpack(read.pop(), stored) if packed else {}
            alone = iter(read)
            arrays = [by_path[r.path] if r.path in packed else next(alone) for r in records]
        except ValueError as e:
            gone = self._read_key(layout.manifest_key(manifest.version)) is None
            reason = "it was deleted while being read" if gone else f"its data is unreadable: {e}"
            raise ParamStoreError(
                f"cannot read {tree} of version {manifest.version} from {self.url}: {reason}"
            ) from e
        hashes = data_sha256s(arrays)
        for record, array, sha in zip(records, arrays, hashes, strict=True):
            if (
                array.dtype.name != record.dtype
                or array.shape != record.shape
                or sha != record.sha256
            ):
                raise DigestMismatch(
                    f"version {manifest.version}: {tree} leaf {record.path!r} does not match "
                    f"its recorded digest (stored {array.dtype.name}{list(array.shape)}, "
                    f"recorded {record.dtype}{list(record.shape)} sha256 {record.sha256[:16]}…)",
                    version=manifest.version,
                    leaf=record.path,
                )
        return {record.path: array for record, array in zip(records, arrays, strict=True)}

    def _same_or_raise(self, manifest: Manifest, raw: bytes) -> str:
        stored = Manifest.decode(raw, version=manifest.version)
        stored_opt = stored.opt_state and stored.opt_state.digest
        new_opt = manifest.opt_state and manifest.opt_state.digest
        if stored.digest != manifest.digest or stored_opt != new_opt:
            raise ParamStoreError(
                f"version {manifest.version} already exists in {self.url} with digest "
                f"{stored.digest} (optimizer state {stored_opt}); versions are immutable and "
                f"this put has digest {manifest.digest} (optimizer state {new_opt})"
            )
        return stored.digest

    def _evict(self, manifest: Manifest) -> None:
        # Marker first, manifest next, data last: a crash anywhere leaves sweepable data.
        self._write_key(layout.pending_key(manifest.data), b"")
        self._write_key(layout.manifest_key(manifest.version), None)
        self._delete_prefix(manifest.data)
        self._write_key(layout.pending_key(manifest.data), None)

    def _delete_prefix(self, data: str) -> None:
        # Concurrent deletes of the listed keys rather than ``delete_range``, which the file
        # driver carries out one key at a time.
        what = f"deleting {data} in {self.url}"
        keys = self._await(self._kv.list(_prefix_range(data)), what)
        for future in [self._kv.write(key, None) for key in keys]:
            self._await(future, what)
        directory = self._location.directory
        if directory is not None:
            _remove_tree(os.path.join(directory, data))


def share_version(source: ParamStore, dest: ParamStore, version: int) -> str:
    """Give store ``dest`` version ``version`` of store ``source`` (parameters and optimizer
    state), by reference where both are local directories: each of its files is hard-linked, no
    byte is copied, and either store may later delete its own links without touching the other's.
    Elsewhere (a memory store, another file system) it is copied through ``get`` and ``put``,
    with the same digest. The manifest is linked last, so ``dest`` sees the version whole or not
    at all. Returns the version's digest; a version ``dest`` holds already must have it."""
    manifest = source.manifest(version)
    if version in dest.versions():
        if dest.digest(version) != manifest.digest:
            raise ParamStoreError(f"version {version} of {dest.url} differs from that of {source.url}")
        return manifest.digest
    src, dst = source._location.directory, dest._location.directory
    if src is not None and dst is not None:
        made: list[str] = []
        try:
            for root, _, files in os.walk(os.path.join(src, manifest.data)):
                here = os.path.join(dst, os.path.relpath(root, src))
                os.makedirs(here, exist_ok=True)
                for name in files:
                    os.link(os.path.join(root, name), os.path.join(here, name))
                    made.append(os.path.join(here, name))
            os.makedirs(os.path.join(dst, layout.MANIFESTS), exist_ok=True)
            os.link(os.path.join(src, layout.manifest_key(version)), os.path.join(dst, layout.manifest_key(version)))
            return manifest.digest
        except OSError:  # another file system, or links refused: copy instead
            for path in made:
                os.unlink(path)
    opt = source.get_opt_state(version) if manifest.opt_state is not None else None
    return dest.put(version, source.get(version), opt)


def _remove_tree(top: str) -> None:
    """Remove what the file driver leaves of a deleted data prefix, then its empty parent.

    Deleting keys leaves directories behind, and a killed writer can leave the driver's
    ``*.__lock`` temporaries, which listing does not show; nothing else writes under a data
    prefix that is being deleted. ``rmdir`` is journaled and can take milliseconds, so the
    directories of one depth are removed concurrently, deepest first.
    """
    top = top.rstrip(os.sep)
    by_depth: dict[int, list[str]] = {}
    for dirpath, _, filenames in os.walk(top):
        for name in filenames:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(dirpath, name))
        by_depth.setdefault(dirpath.count(os.sep), []).append(dirpath)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for depth in sorted(by_depth, reverse=True):
            list(pool.map(_remove_empty_dir, by_depth[depth]))
    _remove_empty_dir(os.path.dirname(top))


def _remove_lock_files(directory: str) -> None:
    """Remove the file driver's ``*.__lock`` temporaries directly in ``directory``: a write killed
    between creating one and renaming it over its key leaves it, and listing does not show it."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    for name in names:
        if name.endswith(".__lock"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))


def _remove_empty_dir(path: str) -> None:
    with contextlib.suppress(OSError):  # not empty, or already gone
        os.rmdir(path)
