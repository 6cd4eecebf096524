"""The changelog envelope: how one state change is encoded in a changelog record's value. Pure: no I/O.

Written by the worker's state store, read by its restore and by the snapshot pipeline.

Layout (all integers big-endian)::

    b"ML1"            magic, 3 bytes
    op                1 byte: b"P" put, b"D" delete
    source offset     8 bytes, signed: offset of the input record whose processing made the change
    source key hash   4 bytes, unsigned: ``route_hash`` of that input record (its lane routing hash)
    payload           the new value for a put (may be empty); empty for a delete

The record key is the state key. A delete is produced as the ``D`` envelope immediately followed by a
null-value tombstone for the same key (see ``docs/state.md``); :meth:`ChangelogCodec.decode` maps a
null value to ``None`` so readers can tell the tombstone apart from the envelope.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "HEADER_SIZE",
    "HEADER_STRUCT",
    "MAGIC",
    "Change",
    "ChangeOp",
    "ChangelogCodec",
    "ChangelogDecodeError",
]

MAGIC = b"ML1"
HEADER_STRUCT = struct.Struct(">3scqI")
HEADER_SIZE = HEADER_STRUCT.size  # 16
_MAX_HASH = (1 << 32) - 1


class ChangelogDecodeError(ValueError):
    """A changelog value does not decode. ``reason`` says why; the worker's
    :class:`multilane.worker.state.errors.ChangelogCorruptError` (a subclass) adds where it was read."""

    def __init__(self, message: str) -> None:
        super().__init__(f"corrupt changelog record: {message}")
        self.reason = message


class ChangeOp(Enum):
    """What a change does to its key."""

    PUT = b"P"
    DELETE = b"D"


@dataclass(frozen=True, slots=True)
class Change:
    """One state change as carried by the changelog.

    Invariants: ``0 <= source_key_hash < 2**32``; ``payload == b""`` when ``op is DELETE``;
    ``source_offset`` fits in a signed 64-bit integer (``-1`` marks a change of unknown source, which
    only a lone tombstone produces and which is always applicable).
    """

    op: ChangeOp
    source_offset: int
    source_key_hash: int
    payload: bytes = b""

    def __post_init__(self) -> None:
        if not isinstance(self.op, ChangeOp):
            raise TypeError(f"op must be a ChangeOp, got {self.op!r}")
        if not -(1 << 63) <= self.source_offset < (1 << 63):
            raise ValueError(f"source offset {self.source_offset} does not fit in 64 signed bits")
        if not 0 <= self.source_key_hash <= _MAX_HASH:
            raise ValueError(f"source key hash {self.source_key_hash} outside [0, 2**32)")
        if not isinstance(self.payload, bytes):
            raise TypeError(f"payload must be bytes, got {type(self.payload).__name__}")
        if self.op is ChangeOp.DELETE and self.payload:
            raise ValueError("a delete change carries no payload")

    @property
    def is_delete(self) -> bool:
        return self.op is ChangeOp.DELETE


class ChangelogCodec:
    """Encodes and decodes :class:`Change` envelopes. Pure and stateless (all methods are static)."""

    @staticmethod
    def encode(change: Change) -> bytes:
        return (
            HEADER_STRUCT.pack(MAGIC, change.op.value, change.source_offset, change.source_key_hash)
            + change.payload
        )

    @staticmethod
    def encode_put(value: bytes, source_offset: int, source_key_hash: int) -> bytes:
        """Fast path of ``encode(Change(PUT, ...))`` for the write path (same bytes, fewer checks)."""
        return HEADER_STRUCT.pack(MAGIC, b"P", source_offset, source_key_hash) + value

    @staticmethod
    def encode_delete(source_offset: int, source_key_hash: int) -> bytes:
        """Fast path of ``encode(Change(DELETE, ...))``: 16 bytes, never empty."""
        return HEADER_STRUCT.pack(MAGIC, b"D", source_offset, source_key_hash)

    @staticmethod
    def decode_fields(value: bytes) -> tuple[int, int, bytes | None]:
        """Restore's fast path: ``(source_offset, source_key_hash, new value or None for a delete)``
        of a non-null value. The one set of checks: :meth:`decode` builds its :class:`Change` on it."""
        if len(value) < HEADER_SIZE:
            raise ChangelogDecodeError(
                f"value has {len(value)} bytes, the envelope header needs {HEADER_SIZE}"
            )
        magic, op, source_offset, source_key_hash = HEADER_STRUCT.unpack_from(value)
        if magic != MAGIC:
            raise ChangelogDecodeError(f"bad magic {magic!r}, expected {MAGIC!r}")
        if source_offset < 0:
            raise ChangelogDecodeError(f"negative source offset {source_offset}")
        if op == b"P":
            return source_offset, source_key_hash, value[HEADER_SIZE:]
        if op == b"D":
            if len(value) != HEADER_SIZE:
                raise ChangelogDecodeError(
                    f"delete envelope carries {len(value) - HEADER_SIZE} payload bytes"
                )
            return source_offset, source_key_hash, None
        raise ChangelogDecodeError(f"unknown op {op!r}, expected b'P' or b'D'")

    @staticmethod
    def decode(value: bytes | None) -> Change | None:
        """Decode a changelog record value; ``None`` for a null tombstone.

        Raises :class:`ChangelogDecodeError` (without an offset; callers add it) when the value is
        too short, has the wrong magic, an unknown op, a negative source offset, or a delete with a
        payload.
        """
        if value is None:
            return None
        if not isinstance(value, bytes | bytearray | memoryview):
            raise ChangelogDecodeError(f"value is a {type(value).__name__}, not bytes")
        source_offset, source_key_hash, payload = ChangelogCodec.decode_fields(bytes(value))
        if payload is None:
            return Change(ChangeOp.DELETE, source_offset, source_key_hash)
        return Change(ChangeOp.PUT, source_offset, source_key_hash, payload)
