"""Moved to :mod:`multilane.formats.keyranges`: this re-export keeps older imports
working (in-flight branches); new code imports from there. Pure: no I/O."""

from multilane.formats.keyranges import (
    HASH_BITS,
    HASH_SPACE,
    KeyRange,
    KeyRangeMap,
    key_hash,
    offset_route_key,
    route_hash,
)

__all__ = ["HASH_BITS", "HASH_SPACE", "KeyRange", "KeyRangeMap", "key_hash", "offset_route_key", "route_hash"]
