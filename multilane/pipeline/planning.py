"""Planning of a snapshot job: changelog extents, offset ranges (Spark tasks) and key-range shards.

Pure: no I/O. The driver measures each changelog partition's extent (I/O, elsewhere), then
:class:`OffsetRangePlanner` cuts the extents into the offset ranges that Spark tasks read, and
:class:`ShardPlanner` says which shard (output file) of the key-range layout each key belongs to.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from multilane.formats.keyranges import HASH_SPACE, KeyRange, KeyRangeMap

__all__ = [
    "OffsetRange",
    "OffsetRangePlanner",
    "PartitionExtent",
    "ShardPlanner",
    "changelog_topic_name",
    "parse_ranges",
]


def changelog_topic_name(group: str, topic: str) -> str:
    """The changelog topic of ``topic``'s state in consumer group ``group``: ``<group>.<topic>.changelog``."""
    return f"{group}.{topic}.changelog"


@dataclass(frozen=True, slots=True)
class PartitionExtent:
    """The part of one changelog partition a snapshot covers: offsets ``[start, end)``.

    Invariants: ``0 <= start <= end``; ``end`` is the *true* end (the next offset to be written when
    the job started, not an admin-API estimate); ``source_bound`` is None (cover everything) or the
    input partition's committed offset when the job started (>= 0).
    """

    topic: str
    changelog_topic: str
    partition: int
    start: int
    end: int
    source_bound: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(
                f"extent of {self.changelog_topic}[{self.partition}] needs 0 <= start <= end, "
                f"got [{self.start}, {self.end})"
            )
        if self.source_bound is not None and self.source_bound < 0:
            raise ValueError(f"source bound must be >= 0 or None, got {self.source_bound}")

    @property
    def records(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """One Spark task's share of a changelog partition: offsets ``[start, end)``.

    Invariant: ``0 <= start < end`` (never empty).
    """

    topic: str
    changelog_topic: str
    partition: int
    start: int
    end: int
    source_bound: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"offset range needs 0 <= start < end, got [{self.start}, {self.end})")


class OffsetRangePlanner:
    """Cuts changelog extents into offset ranges of at most ``max_records`` offsets.

    Invariant: ``max_records >= 1``, ``min_ranges >= 1``. The ranges of a partition are contiguous,
    cover its extent exactly and differ in size by at most one; when the whole job would have fewer
    than ``min_ranges`` ranges (small changelogs), partitions are cut further, in proportion to their
    size, so that every core gets work.
    """

    def __init__(self, max_records: int = 1_000_000, min_ranges: int = 1) -> None:
        if max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {max_records}")
        if min_ranges < 1:
            raise ValueError(f"min_ranges must be >= 1, got {min_ranges}")
        self.max_records = max_records
        self.min_ranges = min_ranges

    def ranges_for(self, extent: PartitionExtent, total_records: int) -> int:
        """How many ranges ``extent`` is cut into, given the total size of the job."""
        n = extent.records
        if n == 0:
            return 0
        k = math.ceil(n / self.max_records)
        if total_records > 0:
            k = max(k, math.ceil(self.min_ranges * n / total_records))
        return min(k, n)

    def plan(self, extents: Sequence[PartitionExtent]) -> list[OffsetRange]:
        total = sum(e.records for e in extents)
        out: list[OffsetRange] = []
        for e in extents:
            k = self.ranges_for(e, total)
            for i in range(k):
                lo = e.start + (e.records * i) // k
                hi = e.start + (e.records * (i + 1)) // k
                out.append(OffsetRange(e.topic, e.changelog_topic, e.partition, lo, hi, e.source_bound))
        return out


def parse_ranges(text: str) -> KeyRangeMap:
    """Parse ``"start:end,start:end,..."`` into a layout that tiles ``[0, 2**32)`` (ValueError if not)."""
    pairs: list[tuple[int, int]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            start_s, end_s = part.split(":")
            pairs.append((int(start_s, 0), int(end_s, 0)))
        except ValueError as exc:
            raise ValueError(
                f"bad key range {part!r}; expected START:END (e.g. 0:{HASH_SPACE // 2})"
            ) from exc
    return KeyRangeMap.from_ranges(pairs)


class ShardPlanner:
    """Maps keys to the shards of a key-range layout: shard ``i`` of a partition holds ``layout[i]``.

    Invariant: ``layout`` tiles the hash space (a :class:`KeyRangeMap`), so every hash has one shard.
    """

    def __init__(self, layout: KeyRangeMap) -> None:
        self.layout = layout

    @property
    def shards_per_partition(self) -> int:
        return len(self.layout)

    def shard_of(self, key_hash: int) -> int:
        return self.layout.lane_of(key_hash)

    def range_of(self, shard: int) -> KeyRange:
        return self.layout[shard]

    def factor(self) -> int | None:
        """``F`` when the layout is ``KeyRangeMap.even(F)``, else None (an explicit layout)."""
        f = len(self.layout)
        return f if KeyRangeMap.even(f) == self.layout else None
