"""Which changelog changes a restore applies, and the learner's buffer of not-yet-committed changes.
Pure: no I/O.

A change is *applicable* when its input record is known complete: its source offset is below the
input partition's committed offset, or the partition's progress record says the record is done.
Changes of other records (in flight when their writer stopped, never completed) are skipped by an
active restore and held back by a learner until they become applicable or are dropped at promotion.
Both keep each key's changes in changelog order: the newest *applicable* change of a key wins.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

__all__ = ["ApplyFilter", "ChangeApplier", "ChangelogEntry", "DoneOracle", "PendingChangeBuffer", "Write"]

Write = tuple[bytes, bytes | None]  # (key, new value) -- None deletes


class DoneOracle(Protocol):
    """What restore needs of a ``ProgressRecord``: is the record at ``offset`` with routing hash
    ``key_hash`` (above the committed offset) complete?"""

    def is_done(self, offset: int, key_hash: int) -> bool: ...


class ChangelogEntry(NamedTuple):
    """A decoded changelog record (a tuple: restore builds one per record). ``offset`` is its
    changelog offset; ``value`` is the new value, None for a delete. ``source_offset == -1`` marks a
    delete of unknown source (a tombstone whose envelope was compacted away)."""

    offset: int
    key: bytes
    source_offset: int
    source_key_hash: int
    value: bytes | None


@dataclass(frozen=True, slots=True)
class ApplyFilter:
    """Invariant: ``committed_offset >= 0``. A change of unknown source (``source_offset == -1``: a
    tombstone whose envelope was compacted away) is always applicable."""

    committed_offset: int
    progress: DoneOracle | None = None

    def __post_init__(self) -> None:
        if self.committed_offset < 0:
            raise ValueError(f"committed offset must be >= 0, got {self.committed_offset}")

    def applicable(self, source_offset: int, source_key_hash: int) -> bool:
        if source_offset < self.committed_offset:
            return True
        return self.progress is not None and self.progress.is_done(source_offset, source_key_hash)

    def at_or_after(self, other: ApplyFilter) -> bool:
        """True when this filter's committed offset has not moved backwards from ``other``'s."""
        return self.committed_offset >= other.committed_offset


def _write_of(entry: ChangelogEntry) -> Write:
    return (entry.key, entry.value)


class PendingChangeBuffer:
    """Changes held back until their input records commit, in changelog order.

    Invariants: ``_entries`` is in increasing changelog offset; ``_keys[k]`` is the number of entries
    of key ``k`` in ``_entries`` (a key with a held-back change holds back its later changes too, so
    that a key's changes are applied in changelog order).
    """

    def __init__(self) -> None:
        self._entries: deque[ChangelogEntry] = deque()
        self._keys: Counter[bytes] = Counter()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def first_offset(self) -> int | None:
        return self._entries[0].offset if self._entries else None

    def holds(self, key: bytes) -> bool:
        return key in self._keys

    def add(self, entry: ChangelogEntry) -> None:
        if self._entries and entry.offset <= self._entries[-1].offset:
            raise ValueError(f"changelog offset {entry.offset} is not after {self._entries[-1].offset}")
        self._entries.append(entry)
        self._keys[entry.key] += 1

    def release(self, flt: ApplyFilter) -> list[tuple[ChangelogEntry, Write]]:
        """Remove and return (in order) the entries now applicable and not behind a held-back change
        of the same key."""
        out: list[tuple[ChangelogEntry, Write]] = []
        kept: deque[ChangelogEntry] = deque()
        blocked: set[bytes] = set()
        for e in self._entries:
            if e.key not in blocked and flt.applicable(e.source_offset, e.source_key_hash):
                out.append((e, _write_of(e)))
                self._keys[e.key] -= 1
                if not self._keys[e.key]:
                    del self._keys[e.key]
            else:
                kept.append(e)
                blocked.add(e.key)
        self._entries = kept
        return out

    def drain(self, flt: ApplyFilter) -> tuple[list[tuple[ChangelogEntry, Write]], int]:
        """Empty the buffer: return the applicable entries in order, drop the rest (their records will
        be processed again). Returns ``(applied, dropped_count)``."""
        out = [(e, _write_of(e)) for e in self._entries if flt.applicable(e.source_offset, e.source_key_hash)]
        dropped = len(self._entries) - len(out)
        self._entries = deque()
        self._keys = Counter()
        return out, dropped


@dataclass
class ChangeApplier:
    """Turns decoded changelog entries into store writes under a filter.

    With ``buffer`` None (active restore) a non-applicable change is skipped; with a buffer (learner)
    it is held back, and so are later changes of the same key. Applied changes whose source is at or
    above the committed offset (done per progress) are recorded in ``above_commit_sources``.
    """

    flt: ApplyFilter
    buffer: PendingChangeBuffer | None = None
    above_commit_sources: set[tuple[int, int]] = field(default_factory=set)
    applied: int = 0
    skipped: int = 0

    def feed(self, entries: Iterable[ChangelogEntry]) -> dict[bytes, bytes | None]:
        """The store writes for ``entries`` (in order; the newest write of a key wins). Hot path of
        every restore: plain tuple fields, no per-record objects beyond the entry."""
        writes: dict[bytes, bytes | None] = {}
        committed = self.flt.committed_offset
        progress = self.flt.progress
        buf = self.buffer
        applied = 0
        for e in entries:
            key, src = e.key, e.source_offset
            if buf is not None and buf.holds(key):
                buf.add(e)
            elif src < committed or (progress is not None and progress.is_done(src, e.source_key_hash)):
                writes[key] = e.value
                applied += 1
                if src >= committed:
                    self.above_commit_sources.add((src, e.source_key_hash))
            elif buf is not None:
                buf.add(e)
            else:
                self.skipped += 1
        self.applied += applied
        return writes

    def release(self) -> list[Write]:
        """Writes of buffered changes that became applicable (learner, after the filter moved)."""
        if self.buffer is None:
            return []
        released = self.buffer.release(self.flt)
        for e, _ in released:
            self._note(e)
        self.applied += len(released)
        return [w for _, w in released]

    def drain(self) -> tuple[list[Write], int]:
        if self.buffer is None:
            return [], 0
        applied, dropped = self.buffer.drain(self.flt)
        for e, _ in applied:
            self._note(e)
        self.applied += len(applied)
        self.skipped += dropped
        return [w for _, w in applied], dropped

    def _note(self, e: ChangelogEntry) -> None:
        if e.source_offset >= self.flt.committed_offset:
            self.above_commit_sources.add((e.source_offset, e.source_key_hash))
