"""Changelog records as the snapshot pipeline sees them, and their decoding. Pure: no I/O.

The state changelog envelope (docs/architecture.md, amended by the state hooks contract)::

    b"ML1" | op (1 byte: b"P" put, b"D" delete) | source offset (8 bytes, big-endian, signed)
           | source key hash (4 bytes, big-endian, unsigned) | payload (value bytes; empty for a delete)

A delete is a ``D`` envelope followed by a null-value tombstone for the same key; readers treat both
as a delete. This module holds a minimal private decoder of that envelope; it is replaced by the state
engineer's codec (``multilane.worker.state.changelog``) once that lands.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

__all__ = [
    "DELETE",
    "ENVELOPE_HEADER",
    "MAGIC",
    "PUT",
    "TOMBSTONE",
    "Change",
    "ChangelogFormatError",
    "decode_change",
    "encode_envelope",
]

MAGIC: Final = b"ML1"
PUT: Final = "P"
DELETE: Final = "D"
TOMBSTONE: Final = "T"
"""Op of a null-value record (Apache Kafka's compaction tombstone); a delete without a source offset."""

_HEADER = struct.Struct(">3scqI")
ENVELOPE_HEADER: Final = _HEADER.size  # 16 bytes
_OPS: Final = {b"P": PUT, b"D": DELETE}


class ChangelogFormatError(ValueError):
    """A changelog record that is neither an ``ML1`` envelope nor a null tombstone."""


class Change(NamedTuple):
    """One decoded changelog record.

    Invariants: ``op`` is one of ``PUT``, ``DELETE``, ``TOMBSTONE``; ``payload`` is empty unless
    ``op == PUT``; a ``TOMBSTONE`` has ``source_offset == -1`` and ``source_key_hash == 0`` (a null
    record carries neither); ``changelog_offset`` is the record's offset in its changelog partition.
    """

    key: bytes
    op: str
    source_offset: int
    source_key_hash: int
    payload: bytes
    changelog_offset: int


def decode_change(key: bytes | None, value: bytes | None, changelog_offset: int) -> Change:
    """Decode one changelog record; raise :class:`ChangelogFormatError` when it is not one."""
    if key is None:
        raise ChangelogFormatError(f"changelog record at offset {changelog_offset} has no key")
    if value is None:
        return Change(key, TOMBSTONE, -1, 0, b"", changelog_offset)
    if len(value) < ENVELOPE_HEADER or value[:3] != MAGIC:
        raise ChangelogFormatError(
            f"changelog record at offset {changelog_offset} is not an ML1 envelope "
            f"({len(value)} bytes, starts {value[:4]!r})"
        )
    _magic, op_byte, source_offset, source_key_hash = _HEADER.unpack_from(value)
    op = _OPS.get(op_byte)
    if op is None:
        raise ChangelogFormatError(
            f"changelog record at offset {changelog_offset} has unknown op {op_byte!r}"
        )
    payload = value[ENVELOPE_HEADER:] if op == PUT else b""
    return Change(key, op, source_offset, source_key_hash, payload, changelog_offset)


def encode_envelope(op: str, source_offset: int, source_key_hash: int, payload: bytes = b"") -> bytes:
    """The envelope bytes of a put or delete (used by tests and benchmarks to write changelogs)."""
    if op not in (PUT, DELETE):
        raise ValueError(f"op must be {PUT!r} or {DELETE!r}, got {op!r}")
    return _HEADER.pack(MAGIC, op.encode(), source_offset, source_key_hash) + (payload if op == PUT else b"")
