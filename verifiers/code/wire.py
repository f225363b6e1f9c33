"""The value encoding that carries function arguments into the sandbox and results out of it.

Plain data only, tagged so that types survive the trip: ``None``, ``bool``, ``int``, ``str`` and
``list`` map to JSON; ``float`` (``repr``, so ``nan``/``inf``/``-0.0`` are exact), ``tuple``,
``dict``, ``set``, ``frozenset`` and ``bytes`` are one-key objects. Types are checked exactly
(``type(x) is int``), so a subclass with a permissive ``__eq__`` cannot cross: a result that is
not plain data is a wrong answer, and the comparison outside only ever sees builtin values.

This module is standard-library only: the sandbox runs it with ``call_driver.py`` and
``check_driver.py``, which also take their protocol streams (:func:`take_stdio`) from it.
"""

from __future__ import annotations

import json

MAX_DEPTH = 100


class WireError(ValueError):
    """A value that cannot be encoded, or a message that is not valid wire data."""


def encode(value, depth: int = 0):
    """A JSON-ready form of ``value``; raises ``WireError`` for anything but plain data."""
    if depth > MAX_DEPTH:
        raise WireError("value nests too deeply")
    t = type(value)
    if value is None or t is bool or t is int or t is str:
        return value
    if t is float:
        return {"float": repr(value)}
    if t is list:
        return [encode(v, depth + 1) for v in value]
    if t is tuple:
        return {"tuple": [encode(v, depth + 1) for v in value]}
    if t is dict:
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if t is set or t is frozenset:
        items = [encode(v, depth + 1) for v in value]
        items.sort(key=lambda x: json.dumps(x, sort_keys=True))  # a set's order is not data
        return {t.__name__: items}
    if t is bytes:
        return {"bytes": value.hex()}
    raise WireError(f"a value of type {t.__name__} is not plain data")


def decode(data, depth: int = 0):
    """The value that ``encode`` produced ``data`` from; raises ``WireError`` on anything else."""
    if depth > MAX_DEPTH:
        raise WireError("value nests too deeply")
    t = type(data)
    if data is None or t is bool or t is int or t is str:
        return data
    if t is list:
        return [decode(v, depth + 1) for v in data]
    if t is dict and len(data) == 1:
        (tag, inner), = data.items()
        try:
            if tag == "float" and type(inner) is str:
                return float(inner)
            if tag == "bytes" and type(inner) is str:
                return bytes.fromhex(inner)
            if type(inner) is list:
                if tag == "tuple":
                    return tuple(decode(v, depth + 1) for v in inner)
                if tag == "set":
                    return {decode(v, depth + 1) for v in inner}
                if tag == "frozenset":
                    return frozenset(decode(v, depth + 1) for v in inner)
                if tag == "dict":
                    return {decode(k, depth + 1): decode(v, depth + 1) for k, v in inner}
        except (TypeError, ValueError) as e:
            raise WireError(f"malformed {tag!r} value: {e}") from None
    raise WireError(f"not a wire value: {str(data)[:80]!r}")


def dumps(message) -> bytes:
    """One protocol line."""
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def send(out, message) -> None:
    """Write ``message`` as one protocol line and flush it."""
    out.write(dumps(message))
    out.flush()


def take_stdio():
    """``(requests, replies)``: a driver's protocol streams, taken from fds 0 and 1 before the
    untrusted code runs, which then reads ``/dev/null`` and prints to stderr, so nothing it
    prints can forge a reply."""
    import os

    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    return requests, replies


def loads(line: bytes):
    """Parse one protocol line; raises ``WireError`` if it is not JSON."""
    try:
        return json.loads(line)
    except (ValueError, RecursionError) as e:
        raise WireError(f"not a protocol line: {e}") from None
