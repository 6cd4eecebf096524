"""Changelog records as the snapshot pipeline sees them. Pure: no I/O.

The envelope (``b"ML1" | op | source offset | source key hash | payload``) is decoded by the
changelog codec, :class:`multilane.formats.changelog.ChangelogCodec`; this module adds what the pipeline
needs around it: the record's key and changelog offset, and an explicit op for null tombstones, in a
small picklable tuple that Spark tasks ship between processes.

A delete is a ``D`` envelope followed by a null-value tombstone for the same key; a tombstone right
after its envelope is redundant, a tombstone on its own (its envelope compacted away) is a delete of
unknown source (see :mod:`multilane.pipeline.merge`).
"""

from __future__ import annotations

from typing import Final, NamedTuple

from multilane.formats.changelog import ChangelogCodec, ChangelogDecodeError, ChangeOp

__all__ = [
    "DELETE",
    "PUT",
    "TOMBSTONE",
    "Change",
    "ChangelogFormatError",
    "decode_change",
    "encode_envelope",
]

PUT: Final = "P"
DELETE: Final = "D"
TOMBSTONE: Final = "T"
"""Op of a null-value record (Apache Kafka's compaction tombstone); a delete without a source offset."""


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
    try:
        change = ChangelogCodec.decode(value)
    except ChangelogDecodeError as exc:
        raise ChangelogFormatError(f"changelog record at offset {changelog_offset}: {exc.reason}") from exc
    if change is None:
        return Change(key, TOMBSTONE, -1, 0, b"", changelog_offset)
    op = PUT if change.op is ChangeOp.PUT else DELETE
    return Change(key, op, change.source_offset, change.source_key_hash, change.payload, changelog_offset)


def encode_envelope(op: str, source_offset: int, source_key_hash: int, payload: bytes = b"") -> bytes:
    """The envelope bytes of a put or delete (tests and benchmarks write changelogs with it)."""
    if op == PUT:
        return ChangelogCodec.encode_put(payload, source_offset, source_key_hash)
    if op == DELETE:
        return ChangelogCodec.encode_delete(source_offset, source_key_hash)
    raise ValueError(f"op must be {PUT!r} or {DELETE!r}, got {op!r}")
