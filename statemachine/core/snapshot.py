"""Reading an engine snapshot that came from outside the process: limits, signatures,
and typed field access that names the bad field.

``Engine.restore`` goes through three gates, in this order, before it builds
anything: the shape gate (only JSON values, at most ``max_depth`` levels deep and
about ``max_bytes`` of JSON text; an iterative walk, so no input can exhaust the
stack), the signature gate (when a key is given), and the field readers below, which
refuse wrong types, missing and unknown keys with a ``SnapshotError`` whose message
starts with the field's path. The engine then checks the parsed snapshot against
itself (``Engine._check_restored``).

Signatures are HMAC-SHA256 over the snapshot's canonical JSON (sorted keys, no
spaces, ASCII only, the ``signature`` field left out), stored as
``"hmac-sha256:<hex>"`` in the ``signature`` field. They prove that a holder of the
key wrote the snapshot and that nobody changed it since; they do not hide anything.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Mapping
from typing import Any, Final

from statemachine.core.errors import SnapshotError, SnapshotSignatureError, UsageError

__all__ = [
    "DEFAULT_MAX_SNAPSHOT_BYTES",
    "DEFAULT_MAX_SNAPSHOT_DEPTH",
    "SIGNATURE_FIELD",
    "check_shape",
    "sign",
    "verify",
]

DEFAULT_MAX_SNAPSHOT_BYTES: Final = 32 * 1024 * 1024
"""About how much JSON text a snapshot may hold (strings counted by length)."""

DEFAULT_MAX_SNAPSHOT_DEPTH: Final = 64
"""How deeply a snapshot may nest. The snapshot's own structure uses six levels; the
rest is for tool-call arguments and schemas. Far below Python's recursion limit, so
the recursive parsers that run after the shape gate cannot exhaust the stack."""

SIGNATURE_FIELD: Final = "signature"
_MAX_INT_BITS: Final = 1024
_SCHEME: Final = "hmac-sha256:"


# -- the shape gate ---------------------------------------------------------------------


def _path(node: tuple[Any, ...] | None) -> str:
    # Paths are kept as (parent, key) links and spelled out only for an error: building
    # a string for every node would cost more than the walk itself.
    parts: list[str] = []
    while node is not None:
        node, key = node
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    return "snapshot" + "".join(reversed(parts))


def check_shape(data: object, *, max_bytes: int, max_depth: int) -> None:
    """Refuse anything but a JSON object within the size and depth limits.

    Walks iteratively; the size is the length of the JSON text, give or take the
    escapes of strings and the digits of numbers.
    """
    if not isinstance(data, Mapping):
        raise SnapshotError(f"snapshot: expected a JSON object, got {type(data).__name__}")
    size = 0
    stack: list[tuple[object, int, tuple[Any, ...] | None]] = [(data, 1, None)]
    while stack:
        value, depth, link = stack.pop()
        if isinstance(value, str):
            size += len(value) + 2
        elif value is None or isinstance(value, bool):
            size += 8
        elif isinstance(value, int):
            # Python reads any length of digits; json and repr refuse past 4300 of them.
            if value.bit_length() > _MAX_INT_BITS:
                raise SnapshotError(f"{_path(link)}: an integer of over {_MAX_INT_BITS} bits")
            size += 8
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise SnapshotError(f"{_path(link)}: {value!r} is not a JSON number")
            size += 8
        elif isinstance(value, (list, tuple)):
            if depth > max_depth:
                raise SnapshotError(f"{_path(link)}: nested deeper than {max_depth} levels")
            size += 2 + len(value)
            stack.extend((item, depth + 1, (link, i)) for i, item in enumerate(value))
        elif isinstance(value, Mapping):
            if depth > max_depth:
                raise SnapshotError(f"{_path(link)}: nested deeper than {max_depth} levels")
            size += 2
            for key, item in value.items():
                if not isinstance(key, str):
                    raise SnapshotError(f"{_path(link)}: object key {key!r} is not a string")
                size += len(key) + 4
                stack.append((item, depth + 1, (link, key)))
        else:
            raise SnapshotError(f"{_path(link)}: a {type(value).__name__} is not a JSON value")
        if size > max_bytes:
            raise SnapshotError(
                f"snapshot: larger than max_bytes={max_bytes} (about {size} bytes read so far)"
            )


# -- signatures -----------------------------------------------------------------------------


def _key_bytes(key: object) -> bytes:
    if isinstance(key, str):
        key = key.encode("utf-8")
    if not isinstance(key, (bytes, bytearray)) or not key:
        raise UsageError("a snapshot key must be non-empty bytes or str")
    return bytes(key)


def _plain(value: object) -> object:
    # json.dumps knows dict and list; a snapshot may hold other mappings and tuples.
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def _digest(data: Mapping[str, Any], key: bytes) -> str:
    body = {k: v for k, v in data.items() if k != SIGNATURE_FIELD}
    text = json.dumps(
        body,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
        allow_nan=False,
        default=_plain,
    )
    return _SCHEME + hmac.new(key, text.encode("ascii"), hashlib.sha256).hexdigest()


def sign(data: Mapping[str, Any], key: bytes | str) -> dict[str, Any]:
    """A copy of ``data`` with a ``signature`` field over the rest of it."""
    signed = {k: v for k, v in data.items() if k != SIGNATURE_FIELD}
    signed[SIGNATURE_FIELD] = _digest(signed, _key_bytes(key))
    return signed


def verify(data: Mapping[str, Any], key: bytes | str) -> None:
    """Refuse ``data`` unless its signature is the one ``key`` gives (shape-checked data)."""
    raw = _key_bytes(key)
    given = data.get(SIGNATURE_FIELD)
    if given is None:
        raise SnapshotSignatureError(
            "snapshot.signature: missing, but a key was given (sign snapshots with "
            "snapshot(key=...) or Engine.sign_snapshot before they leave the process)"
        )
    if not isinstance(given, str):
        raise SnapshotSignatureError(
            f"snapshot.signature: expected a string, got {type(given).__name__}"
        )
    expected = _digest(data, raw)
    if not hmac.compare_digest(expected.encode("ascii"), given.encode("utf-8", "replace")):
        raise SnapshotSignatureError(
            "snapshot.signature: does not match the key: the snapshot was changed after it "
            "was signed, or signed with another key"
        )


# -- typed field access ------------------------------------------------------------------------


def field(d: Mapping[str, Any], key: str, path: str) -> Any:
    if key not in d:
        raise SnapshotError(f"{path}.{key}: missing")
    return d[key]


def obj(value: object, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SnapshotError(f"{path}: expected an object, got {type(value).__name__}")
    return value


def array(d: Mapping[str, Any], key: str, path: str) -> list[Any] | tuple[Any, ...]:
    value = field(d, key, path)
    if not isinstance(value, (list, tuple)):
        raise SnapshotError(f"{path}.{key}: expected an array, got {type(value).__name__}")
    return value


def string(d: Mapping[str, Any], key: str, path: str, *, optional: bool = False) -> Any:
    value = field(d, key, path)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        want = "a string or null" if optional else "a string"
        raise SnapshotError(f"{path}.{key}: expected {want}, got {type(value).__name__}")
    return value


def boolean(d: Mapping[str, Any], key: str, path: str) -> bool:
    value = field(d, key, path)
    if not isinstance(value, bool):
        raise SnapshotError(f"{path}.{key}: expected true or false, got {type(value).__name__}")
    return value


def integer(d: Mapping[str, Any], key: str, path: str, *, minimum: int) -> int:
    value = field(d, key, path)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SnapshotError(f"{path}.{key}: expected an integer >= {minimum}, got {value!r:.40}")
    return value


def only_keys(d: Mapping[str, Any], allowed: frozenset[str], path: str) -> None:
    extra = d.keys() - allowed
    if extra:
        raise SnapshotError(f"{path}: unknown key(s) {', '.join(sorted(map(repr, extra)))}")
