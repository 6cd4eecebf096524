"""Moved to :mod:`multilane.formats.changelog`: this re-export keeps older imports
working (in-flight branches); new code imports from there. Pure: no I/O."""

from multilane.formats.changelog import (
    HEADER_SIZE,
    HEADER_STRUCT,
    MAGIC,
    Change,
    ChangelogCodec,
    ChangelogDecodeError,
    ChangeOp,
)

__all__ = [
    "HEADER_SIZE",
    "HEADER_STRUCT",
    "MAGIC",
    "Change",
    "ChangeOp",
    "ChangelogCodec",
    "ChangelogDecodeError",
]
