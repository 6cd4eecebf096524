"""``JsonValues``: ``get_json`` / ``put_json`` over a state view's ``get`` / ``put``, and the checks of
keys and values every view makes (:func:`checked_key`, :func:`checked_value`). Pure: no I/O.

Shared by the worker's :class:`~multilane.worker.state.view.KeyRangeStateView` and the unit-test
harness's :class:`~multilane.testing.memory_state.MemoryStateView`, so both read and write values the
same way: keys non-empty bytes, values bytes (a ``bytearray`` or ``memoryview`` copied), JSON compact
UTF-8 with no NaN, and a value that is not JSON is a :class:`StateError` naming its key.
"""

from __future__ import annotations

import json
from typing import Any

from multilane.worker.state.errors import StateError, StateKeyError

__all__ = ["JsonValues", "checked_key", "checked_value"]


def checked_key(key: object) -> bytes:
    """``key`` when it is non-empty bytes, else :class:`StateKeyError`."""
    if not isinstance(key, bytes):
        raise StateKeyError(f"state keys must be bytes, got {type(key).__name__}")
    if not key:
        raise StateKeyError("state keys must not be empty")
    return key


def checked_value(value: object) -> bytes:
    """``value`` as bytes (a ``bytearray`` or ``memoryview`` copied), else ``TypeError``."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"state values must be bytes (use put_json for objects), got {type(value).__name__}")


class JsonValues:
    """Mixin: a view supplies ``_resolve``, ``get`` and ``put``; this adds the JSON forms."""

    def _resolve(self, key: bytes | None) -> bytes:
        raise NotImplementedError

    def get(self, key: bytes | None = None) -> bytes | None:
        raise NotImplementedError

    def put(self, value: bytes, key: bytes | None = None) -> None:
        raise NotImplementedError

    def get_json(self, key: bytes | None = None) -> Any:
        """The value of ``key`` (this record's key by default) decoded from JSON; None when absent."""
        raw = self.get(key)
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            k = self._resolve(key)
            raise StateError(f"state value of key {k[:64]!r} is not JSON: {exc}") from exc

    def put_json(self, value: Any, key: bytes | None = None) -> None:
        """Store ``value`` as compact JSON (TypeError when it is not JSON-serialisable)."""
        try:
            raw = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise TypeError(f"state value is not JSON-serialisable: {exc}") from exc
        self.put(raw, key)
