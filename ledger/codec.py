"""The codec of event bodies: an event's fields as a canonical map, and back with upcasting.

The store keeps ``(kind, version, body)``; the body is the canonical msgpack (``ledger.canonical``)
of the event's fields as a map sorted by name. So the same event always gives the same bytes.
Bodies of older schema versions are upcast step by step when read (``ledger.events.upcaster``).
"""

from __future__ import annotations

import dataclasses
import functools

from ledger.canonical import pack as pack  # runtime.config and runtime.service.wire import it from here
from ledger.canonical import pack_fields, unpack
from ledger.errors import CodecError
from ledger.events import EVENTS, Event, Registry


@functools.cache
def _sorted_fields(cls: type) -> tuple[str, ...] | None:
    """The field names of an event class, sorted; None for anything that is not an event."""
    if not (isinstance(cls, type) and issubclass(cls, Event) and dataclasses.is_dataclass(cls)):
        return None
    return tuple(sorted(f.name for f in dataclasses.fields(cls)))


def encode_body(ev: Event) -> bytes:
    """The canonical body bytes of an event (its fields as a sorted map)."""
    names = _sorted_fields(type(ev))  # type: ignore[arg-type]  # a class is hashable (mypy#11470)
    if names is None:
        raise CodecError(f"not an event: {type(ev).__name__}")
    return pack_fields(names, ev.__dict__, f"{ev.KIND} event")


def decode_body(kind: str, version: int, body: bytes, registry: Registry = EVENTS) -> Event:
    """Decode a stored body of ``kind`` at schema ``version`` into the current event class.

    Older versions are upcast step by step; unknown kinds, versions newer than this software,
    missing upcasters, unknown or missing fields raise ``CodecError``.
    """
    current = registry.current.get(kind)
    if current is None:
        raise CodecError(f"unknown event kind {kind!r}; known kinds: {', '.join(registry.kinds())}")
    cls, current_version, sorted_names = current
    fields = unpack(body)
    if type(fields) is not dict:
        raise CodecError(f"malformed {kind} body: expected a map of fields, got {type(fields).__name__}")
    if version == current_version and tuple(fields) == sorted_names:
        # A current, canonical body holds exactly the declared fields in sorted order: build the
        # frozen instance directly (the common case when reading a log; about 3x faster).
        ev = object.__new__(cls)
        ev.__dict__.update(fields)
        return ev
    if version > cls.VERSION:
        raise CodecError(
            f"{kind} body has schema version {version}, newer than this software's {cls.VERSION}"
        )
    while version < cls.VERSION:
        up = registry.upcaster(kind, version)
        if up is None:
            raise CodecError(f"no upcaster for {kind} from schema version {version}")
        fields = up(dict(fields))
        version += 1
    names = registry.field_names(kind)
    unknown = [k for k in fields if k not in names]
    if unknown:
        raise CodecError(f"malformed {kind} body: unknown fields {sorted(unknown)}")
    missing = registry.required(kind) - fields.keys()
    if missing:
        raise CodecError(f"malformed {kind} body: missing fields {sorted(missing)}")
    return cls(**fields)


def encode_event(ev: Event) -> tuple[str, int, bytes]:
    """``(kind, version, body)`` as stored."""
    return ev.KIND, ev.VERSION, encode_body(ev)
