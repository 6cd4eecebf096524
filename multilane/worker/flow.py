"""Back-pressure: bounds on records and bytes in flight, per partition and per process.

Pure: no I/O (the engine turns the decisions into ``consumer.pause()`` / ``resume()`` calls).

"In flight" means fetched and handed to the engine but not yet complete: queued in a lane, running,
waiting for a retry or for a dead letter's acknowledgement. The engine asks :meth:`FlowController.admit`
before dispatching each fetched record; when a record does not fit, the engine pauses fetching of its
partition and seeks back to that record, so the bounds hold strictly. A paused partition resumes when
both its own and the process's usage fell below ``resume_fraction`` of the bounds (hysteresis).

Fairness: unless a per-partition bound is configured, a partition may hold at most an equal share of
the process bound (``max // partitions``, at least one record). Without it, one backlogged partition
fills the whole process bound and the others wait until it drains (measured: ~50 s without a single
completion on the other partitions of a worker under a backlog).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FlowController", "FlowCounters"]


@dataclass(slots=True)
class FlowCounters:
    """In-flight usage of one partition.

    Invariant: ``records >= 0`` and ``bytes >= 0``; they count exactly the partition's records that
    were admitted and not yet released.
    """

    records: int = 0
    bytes: int = 0
    paused: bool = False  # fetching paused by back-pressure (not by the operator's pause)
    pauses: int = 0  # how many times back-pressure paused this partition
    peak_records: int = 0
    peak_bytes: int = 0


class FlowController:
    """Admission control over per-partition and per-process in-flight bounds."""

    __slots__ = (
        "bytes",
        "explicit_part_max_bytes",
        "explicit_part_max_records",
        "max_bytes",
        "max_records",
        "part_max_bytes",
        "part_max_records",
        "peak_bytes",
        "peak_records",
        "records",
        "resume_fraction",
    )

    def __init__(
        self,
        max_records: int,
        max_bytes: int,
        part_max_records: int | None = None,
        part_max_bytes: int | None = None,
        resume_fraction: float = 0.5,
    ) -> None:
        if max_records < 1 or max_bytes < 1:
            raise ValueError("in-flight bounds must be >= 1")
        self.max_records = max_records
        self.max_bytes = max_bytes
        # Configured per-partition bounds (None: only the fair share applies).
        self.explicit_part_max_records = part_max_records
        self.explicit_part_max_bytes = part_max_bytes
        # Effective per-partition bounds. Invariant: min(explicit bound, process bound // partitions),
        # at least 1 record / 1 byte; recomputed by set_partitions().
        self.part_max_records = min(part_max_records or max_records, max_records)
        self.part_max_bytes = min(part_max_bytes or max_bytes, max_bytes)
        self.resume_fraction = resume_fraction
        # Process totals. Invariant: the sums of the FlowCounters of all live partitions.
        self.records = 0
        self.bytes = 0
        self.peak_records = 0
        self.peak_bytes = 0

    def set_partitions(self, count: int) -> None:
        """Recompute the per-partition bounds for ``count`` live partitions (fair shares)."""
        n = max(1, count)
        self.part_max_records = max(1, min(self.explicit_part_max_records or self.max_records,
                                           self.max_records // n))
        self.part_max_bytes = max(1, min(self.explicit_part_max_bytes or self.max_bytes,
                                         self.max_bytes // n))

    def room(self) -> int:
        """How many more records the process may take now (for sizing a consume call)."""
        return max(0, self.max_records - self.records)

    def budget(self, part: FlowCounters) -> tuple[int, int]:
        """(records, bytes) ``part`` may still take now. The byte budget may be exceeded by a single
        record when the partition has nothing in flight (see :meth:`admit`)."""
        return (
            min(self.part_max_records - part.records, self.max_records - self.records),
            min(self.part_max_bytes - part.bytes, self.max_bytes - self.bytes),
        )

    def take(self, part: FlowCounters, records: int, nbytes: int) -> None:
        """Charge ``records`` / ``nbytes`` that fit the :meth:`budget` taken just before."""
        part.records += records
        part.bytes += nbytes
        self.records += records
        self.bytes += nbytes
        self._peaks(part)

    def _peaks(self, part: FlowCounters) -> None:
        """Raise the peak counters of ``part`` and of the process to the current use."""
        if part.records > part.peak_records:
            part.peak_records = part.records
        if part.bytes > part.peak_bytes:
            part.peak_bytes = part.bytes
        if self.records > self.peak_records:
            self.peak_records = self.records
        if self.bytes > self.peak_bytes:
            self.peak_bytes = self.bytes

    def admit(self, part: FlowCounters, nbytes: int) -> bool:
        """Take one record of ``nbytes`` for ``part`` if it fits; True when taken.

        A record larger than a byte bound is admitted only when its partition has nothing in flight,
        so that it cannot block the partition forever.
        """
        r = part.records
        if r >= self.part_max_records or self.records >= self.max_records:
            return False
        if r and (part.bytes + nbytes > self.part_max_bytes or self.bytes + nbytes > self.max_bytes):
            return False
        part.records = r + 1
        part.bytes += nbytes
        self.records += 1
        self.bytes += nbytes
        self._peaks(part)
        return True

    def release(self, part: FlowCounters, nbytes: int) -> None:
        """Give back one record's share (it completed)."""
        part.records -= 1
        part.bytes -= nbytes
        self.records -= 1
        self.bytes -= nbytes

    def release_many(self, part: FlowCounters, records: int, nbytes: int) -> None:
        """Give back several records' shares at once."""
        part.records -= records
        part.bytes -= nbytes
        self.records -= records
        self.bytes -= nbytes

    def forget(self, part: FlowCounters) -> None:
        """Drop a partition's usage from the totals (the partition was released with work abandoned)."""
        self.records -= part.records
        self.bytes -= part.bytes
        part.records = 0
        part.bytes = 0

    def can_resume(self, part: FlowCounters) -> bool:
        """True when a back-pressure-paused partition may fetch again (both levels below low water)."""
        f = self.resume_fraction
        return (
            part.records <= self.part_max_records * f
            and part.bytes <= self.part_max_bytes * f
            and self.records <= self.max_records * f
            and self.bytes <= self.max_bytes * f
        )
