"""Key hashing and key ranges: how records of a partition are spread over its lanes.

Pure: no I/O. Every record's key is hashed into the 32-bit space ``[0, 2**32)``; a
:class:`KeyRangeMap` cuts that space into contiguous half-open ranges, one per lane, and
``lane_of(h)`` finds the lane of a hash with a bisect.

``key_hash`` is ``zlib.crc32`` followed by murmur3's 32-bit finaliser (``fmix32``). CRC-32 alone is
fast and stable but its high bits are poorly mixed for short, similar keys (``user-1``, ``user-2``, ...),
and lanes are *contiguous* ranges, i.e. selected by the high bits; the finaliser avalanches every
input bit into every output bit so that contiguous ranges receive even load. Both steps are fixed
functions of the key bytes: the hash is the same in every process, on every platform and version
(never Python's salted ``hash``).
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "HASH_BITS",
    "HASH_SPACE",
    "KeyRange",
    "KeyRangeMap",
    "key_hash",
    "offset_route_key",
    "route_hash",
]

HASH_BITS = 32
HASH_SPACE = 1 << HASH_BITS


def key_hash(key: bytes) -> int:
    """Hash ``key`` into ``[0, 2**32)``; stable across processes, platforms and versions.

    ``fmix32(crc32(key))``; the finaliser (a bijection on 32-bit ints) is inlined because this runs
    once per record.
    """
    h = zlib.crc32(key)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def offset_route_key(offset: int) -> bytes:
    """The routing key of a record without a key: its offset as 8 big-endian bytes (signed)."""
    return int(offset).to_bytes(8, "big", signed=True)


def route_hash(key: bytes | None, offset: int) -> int:
    """The hash a record is routed by: ``key_hash(key)``, or of its offset when it has no key."""
    return key_hash(key if key is not None else offset_route_key(offset))


@dataclass(frozen=True, slots=True)
class KeyRange:
    """A half-open range ``[start, end)`` of the hash space.

    Invariant: ``0 <= start < end <= HASH_SPACE`` (never empty).
    """

    start: int
    end: int

    def __post_init__(self) -> None:
        if not (isinstance(self.start, int) and isinstance(self.end, int)):
            raise TypeError(f"KeyRange bounds must be ints, got {self.start!r}, {self.end!r}")
        if not 0 <= self.start < self.end <= HASH_SPACE:
            raise ValueError(f"KeyRange [{self.start}, {self.end}) must satisfy 0 <= start < end <= 2**32")

    def contains(self, h: int) -> bool:
        return self.start <= h < self.end

    def __contains__(self, h: object) -> bool:
        return isinstance(h, int) and self.contains(h)

    @property
    def width(self) -> int:
        return self.end - self.start


def _even_starts(f: int) -> list[int]:
    return [(i * HASH_SPACE) // f for i in range(f)]


class KeyRangeMap:
    """An immutable layout of lanes over the hash space: lane ``i`` owns ``ranges[i]``.

    Invariant (checked on construction): ``ranges`` is non-empty, sorted, contiguous
    (``ranges[i].end == ranges[i + 1].start``), starts at 0 and ends at ``HASH_SPACE`` -- every hash
    belongs to exactly one lane. ``_starts[i] == ranges[i].start`` (the bisect index).
    """

    __slots__ = ("_ranges", "_starts")

    def __init__(self, ranges: Sequence[KeyRange]) -> None:
        rs = tuple(ranges)
        if not rs:
            raise ValueError("a KeyRangeMap needs at least one range")
        for r in rs:
            if not isinstance(r, KeyRange):
                raise TypeError(f"expected KeyRange, got {type(r).__name__}")
        if rs[0].start != 0:
            raise ValueError(f"key ranges must start at 0, first starts at {rs[0].start}")
        for i in range(len(rs) - 1):
            if rs[i].end != rs[i + 1].start:
                raise ValueError(
                    f"key ranges must be contiguous: range {i} ends at {rs[i].end}, "
                    f"range {i + 1} starts at {rs[i + 1].start}"
                )
        if rs[-1].end != HASH_SPACE:
            raise ValueError(f"key ranges must end at 2**32, last ends at {rs[-1].end}")
        self._ranges: tuple[KeyRange, ...] = rs
        self._starts: list[int] = [r.start for r in rs]

    # -- constructors -------------------------------------------------------------------------------

    @classmethod
    def even(cls, f: int) -> KeyRangeMap:
        """``f`` ranges of (almost) equal width; widths differ by at most 1."""
        if not isinstance(f, int) or isinstance(f, bool) or f < 1:
            raise ValueError(f"factor must be an int >= 1, got {f!r}")
        if f > HASH_SPACE:
            raise ValueError(f"factor {f} exceeds the hash space 2**32")
        starts = _even_starts(f)
        ends = [*starts[1:], HASH_SPACE]
        return cls([KeyRange(s, e) for s, e in zip(starts, ends, strict=True)])

    @classmethod
    def from_ranges(cls, ranges: Iterable[KeyRange | tuple[int, int]]) -> KeyRangeMap:
        """Build from ``KeyRange``s or ``(start, end)`` pairs; ValueError unless they tile the space."""
        out: list[KeyRange] = []
        for r in ranges:
            if isinstance(r, KeyRange):
                out.append(r)
            else:
                try:
                    start, end = r
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"expected a (start, end) pair, got {r!r}") from exc
                out.append(KeyRange(start, end))
        return cls(out)

    @classmethod
    def from_list(cls, data: Any) -> KeyRangeMap:
        """Inverse of :meth:`to_list`: a list of ``[start, end]`` pairs."""
        if not isinstance(data, list | tuple):
            raise ValueError(f"expected a list of [start, end] pairs, got {type(data).__name__}")
        return cls.from_ranges(data)

    # -- queries ------------------------------------------------------------------------------------

    @property
    def ranges(self) -> tuple[KeyRange, ...]:
        return self._ranges

    def __len__(self) -> int:
        return len(self._ranges)

    def __getitem__(self, lane: int) -> KeyRange:
        return self._ranges[lane]

    def __iter__(self) -> Iterator[KeyRange]:
        return iter(self._ranges)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KeyRangeMap) and self._ranges == other._ranges

    def __hash__(self) -> int:
        return hash(self._ranges)

    def __repr__(self) -> str:
        return f"KeyRangeMap({[(r.start, r.end) for r in self._ranges]!r})"

    def lane_of(self, h: int) -> int:
        """The lane whose range contains hash ``h`` (``0 <= h < 2**32``)."""
        if not 0 <= h < HASH_SPACE:
            raise ValueError(f"hash {h} outside [0, 2**32)")
        return bisect.bisect_right(self._starts, h) - 1

    def to_list(self) -> list[list[int]]:
        """JSON-friendly form: ``[[start, end], ...]``."""
        return [[r.start, r.end] for r in self._ranges]

    # -- derived layouts ----------------------------------------------------------------------------

    def _check_lane(self, lane: int) -> None:
        if not 0 <= lane < len(self._ranges):
            raise IndexError(f"lane {lane} out of range for {len(self._ranges)} lanes")

    def split(self, lane: int) -> KeyRangeMap:
        """Split lane ``lane`` into two halves (lanes ``lane`` and ``lane + 1``); later lanes shift up."""
        self._check_lane(lane)
        r = self._ranges[lane]
        if r.width < 2:
            raise ValueError(f"lane {lane} has width {r.width} and cannot be split")
        mid = r.start + r.width // 2
        new = (*self._ranges[:lane], KeyRange(r.start, mid), KeyRange(mid, r.end), *self._ranges[lane + 1 :])
        return KeyRangeMap(new)

    def merge(self, lane: int) -> KeyRangeMap:
        """Merge lane ``lane`` with lane ``lane + 1``; later lanes shift down."""
        self._check_lane(lane)
        if lane + 1 >= len(self._ranges):
            raise ValueError(f"lane {lane} is the last lane and has no next lane to merge with")
        a, b = self._ranges[lane], self._ranges[lane + 1]
        new = (*self._ranges[:lane], KeyRange(a.start, b.end), *self._ranges[lane + 2 :])
        return KeyRangeMap(new)

    def resize(self, f: int) -> KeyRangeMap:
        """The even layout with ``f`` lanes (``self`` when it already is that layout)."""
        target = KeyRangeMap.even(f)
        return self if target == self else target
