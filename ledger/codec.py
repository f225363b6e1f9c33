"""The codec of event bodies: an event's field values in a canonical array, and back with upcasting.

The store keeps ``(kind, version, body)``; the body is the canonical msgpack (``ledger.canonical``)
of the event's field *values* as an array, in the order of their sorted names: the names are the
kind's at that version (``Registry.layout``), so they are not repeated in every record. So the
same event always gives the same bytes. Ledgers written before this encoding hold each body as a
map of the fields by name (a third of a rollout's bytes were its field names); such bodies still
decode, and :func:`encode_map_body` still writes them where a format fixed them (a controller
snapshot's cached events). Bodies of older schema versions are upcast step by step when read
(``ledger.events.upcaster``).
"""

from __future__ import annotations

import dataclasses
import functools

from ledger.canonical import pack as pack  # runtime.config and runtime.service.wire import it from here
from ledger.canonical import pack_fields, pack_values, unpack
from ledger.errors import CodecError
from ledger.events import EVENTS, Event, Registry


@functools.cache
def _sorted_fields(cls: type) -> tuple[str, ...] | None:
    """The field names of an event class, sorted; None for anything that is not an event."""
    if not (isinstance(cls, type) and issubclass(cls, Event) and dataclasses.is_dataclass(cls)):
        return None
    return tuple(sorted(f.name for f in dataclasses.fields(cls)))


def _names(ev: Event) -> tuple[str, ...]:
    names = _sorted_fields(type(ev))  # type: ignore[arg-type]  # a class is hashable (mypy#11470)
    if names is None:
        raise CodecError(f"not an event: {type(ev).__name__}")
    return names


def encode_body(ev: Event) -> bytes:
    """The canonical body bytes of an event: its field values as an array, by sorted name."""
    return pack_values(_names(ev), ev.__dict__, f"{ev.KIND} event")


def encode_map_body(ev: Event) -> bytes:
    """The body as written before positional bodies: the fields as a map sorted by name."""
    return pack_fields(_names(ev), ev.__dict__, f"{ev.KIND} event")


def decode_body(kind: str, version: int, body: bytes, registry: Registry = EVENTS) -> Event:
    """Decode a stored body of ``kind`` at schema ``version`` into the current event class.

    The body is an array of field values (by the sorted names of ``version``'s fields) or, when
    written before that encoding, a map of fields by name. Older versions are upcast step by
    step; unknown kinds, versions newer than this software, missing upcasters or layouts,
    unknown or missing fields raise ``CodecError``.
    """
    current = registry.current.get(kind)
    if current is None:
        raise CodecError(f"unknown event kind {kind!r}; known kinds: {', '.join(registry.kinds())}")
    cls, current_version, sorted_names = current
    fields = unpack(body)
    if type(fields) is tuple:
        if version == current_version and len(fields) == len(sorted_names):
            # The common case when reading a log: build the frozen instance directly.
            ev = object.__new__(cls)
            ev.__dict__.update(zip(sorted_names, fields, strict=True))
            return ev
        names = registry.layout(kind, version)
        if names is None:
            raise CodecError(f"{kind} body of schema version {version} is an array, and no field layout of that "
                             f"version is known" if version <= cls.VERSION else
                             f"{kind} body has schema version {version}, newer than this software's {cls.VERSION}")
        if len(fields) != len(names):
            raise CodecError(f"malformed {kind} body: {len(fields)} values for the {len(names)} fields {list(names)}")
        fields = dict(zip(names, fields, strict=True))
    elif type(fields) is not dict:
        raise CodecError(f"malformed {kind} body: expected an array or a map of fields, got {type(fields).__name__}")
    elif version == current_version and tuple(fields) == sorted_names:
        # A current, canonical map body holds exactly the declared fields in sorted order.
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
