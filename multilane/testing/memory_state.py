"""``MemoryStateView``: the ``ctx.state`` of :func:`multilane.testing.run_processor`, backed by a dict.
Pure: no I/O.

Same API and the same errors as the worker's ``KeyRangeStateView`` (``multilane.worker.state.view``):
keys default to the record's key, a keyless record needs ``key=...``, keys are non-empty bytes, values
are bytes (``put_json`` / ``get_json`` for JSON). There is one lane, so every key is in range.
"""

from __future__ import annotations

from collections.abc import MutableMapping

from multilane.api import StateView
from multilane.worker.state.errors import StateKeyError
from multilane.worker.state.json_values import JsonValues, checked_key, checked_value

__all__ = ["MemoryStateView"]


class MemoryStateView(JsonValues):
    """Implements :class:`multilane.api.StateView` over ``store`` for one processing attempt.

    Invariant: ``store`` maps bytes keys to bytes values, exactly what the worker's store would hold.
    """

    __slots__ = ("_key", "_store", "_where")

    def __init__(self, store: MutableMapping[bytes, bytes], key: bytes | None, where: str) -> None:
        self._store = store
        self._key = key
        self._where = where  # "topic[partition]@offset", for error messages

    def _resolve(self, key: bytes | None) -> bytes:
        if key is None:
            if self._key is None:
                raise StateKeyError(f"record {self._where} has no key: pass key=... explicitly")
            key = self._key
        return checked_key(key)

    def get(self, key: bytes | None = None) -> bytes | None:
        return self._store.get(self._resolve(key))

    def put(self, value: bytes, key: bytes | None = None) -> None:
        value = checked_value(value)  # first, as the worker's view: a bad value is named before a bad key
        self._store[self._resolve(key)] = value

    def delete(self, key: bytes | None = None) -> None:
        self._store.pop(self._resolve(key), None)


def _conforms(view: MemoryStateView) -> StateView:  # mypy checks the view against the public API
    return view
