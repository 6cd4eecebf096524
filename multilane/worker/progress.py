"""Moved to :mod:`multilane.formats.progress`: this re-export keeps older imports
working (in-flight branches); new code imports from there. Pure: no I/O."""

from multilane.formats.progress import (
    METADATA_LIMIT,
    ProgressCodec,
    ProgressDecodeError,
    ProgressRecord,
    fits_in_metadata,
    intervals_from_offsets,
)

__all__ = [
    "METADATA_LIMIT",
    "ProgressCodec",
    "ProgressDecodeError",
    "ProgressRecord",
    "fits_in_metadata",
    "intervals_from_offsets",
]
