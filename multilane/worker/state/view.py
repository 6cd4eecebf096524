"""``KeyRangeStateView``: the ``ctx.state`` a processor gets for one record. Does I/O through its
partition (RocksDB reads; writes also produce changelog records).

Keys default to the record's key. Any other key is allowed when it belongs to the lane's key range
(``key_hash(key)`` in ``key_range``): a lane only touches keys it exclusively owns, so lanes never race
on a key. A key outside the range, a non-bytes or empty key, or a keyless record without an explicit
key raises :class:`StateKeyError` before anything is read or written.
"""

from __future__ import annotations

from multilane.api import StateView
from multilane.formats.keyranges import KeyRange, key_hash
from multilane.worker.state.errors import StateKeyError
from multilane.worker.state.json_values import JsonValues, checked_key, checked_value
from multilane.worker.state.partition import ActivePartitionState

__all__ = ["KeyRangeStateView"]


class KeyRangeStateView(JsonValues):
    """Implements :class:`multilane.api.StateView` for one processing attempt.

    Invariant: writes carry ``(source_offset, source_key_hash)`` of the record being processed.
    """

    __slots__ = ("_key", "_part", "_range", "_source_key_hash", "_source_offset")

    def __init__(
        self,
        part: ActivePartitionState,
        key: bytes | None,
        key_range: KeyRange,
        source_offset: int,
        source_key_hash: int,
    ) -> None:
        self._part = part
        self._key = key
        self._range = key_range
        self._source_offset = source_offset
        self._source_key_hash = source_key_hash

    def _resolve(self, key: bytes | None) -> bytes:
        if key is None or key is self._key:
            own = self._key
            if own is None:
                raise StateKeyError(
                    f"record {self._part.topic}[{self._part.partition}]@{self._source_offset} has no key: "
                    "pass key=... explicitly"
                )
            # The record's own key: its hash is the routing hash the engine already computed.
            if own and self._range.contains(self._source_key_hash):
                return own
            key = own
        key = checked_key(key)
        h = key_hash(key)
        if not self._range.contains(h):
            raise StateKeyError(
                f"state key {key[:64]!r} hashes to {h}, outside this lane's key range "
                f"[{self._range.start}, {self._range.end}); a lane may only use keys of its own range"
            )
        return key

    def get(self, key: bytes | None = None) -> bytes | None:
        return self._part.get(self._resolve(key))

    def put(self, value: bytes, key: bytes | None = None) -> None:
        value = checked_value(value)  # before the key (a bad value is named before a bad key)
        self._part.put(self._resolve(key), value, self._source_offset, self._source_key_hash)

    def delete(self, key: bytes | None = None) -> None:
        self._part.delete(self._resolve(key), self._source_offset, self._source_key_hash)


def _conforms(view: KeyRangeStateView) -> StateView:  # mypy checks the view against the public API
    return view
