"""Replay and merge semantics of state changelogs: newest value per key, deletes honoured. Pure: no I/O.

Three users share these rules so that they cannot drift apart:

* :class:`ChangelogReplayer` -- restore by replay (full replay, or the tail after a snapshot);
* :func:`merge_range` -- what a Spark task keeps of the offset range it read (and
  :func:`merge_raw_range`, its fast path over undecoded records, which the Spark task runs);
* :func:`combine_ranges` -- the driver-free reference of how range results combine into a snapshot
  (the Spark job does the same thing distributed; tests compare the two).

Rules (in changelog-offset order):

1. A ``P`` envelope sets the key's value; a ``D`` envelope removes the key.
2. A null tombstone right after a ``D`` envelope of the same key repeats that delete and is ignored; a
   tombstone on its own (its envelope compacted away) removes the key.
3. Restore with a committed offset ``C`` of the input partition skips envelopes whose source offset
   is ``>= C`` (produced for records whose processing was never committed; they are re-produced when
   those records are processed again).
4. A snapshot may only contain changes that every later restore applies. With a *source bound* ``B``
   (the input partition's committed offset when the job started; ``C >= B`` for every later restore),
   the snapshot covers the changelog prefix before the first envelope whose source offset is ``>= B``;
   that offset becomes the snapshot's ``changelog_offset`` and restore replays from there (rule 3
   then decides). Without a bound (``None``) the whole changelog is covered.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from multilane.formats.changelog import HEADER_SIZE, HEADER_STRUCT, MAGIC
from multilane.pipeline.changes import DELETE, PUT, TOMBSTONE, Change, ChangelogFormatError, decode_change

__all__ = [
    "ChangelogReplayer",
    "CombinedPartition",
    "RangeMergeResult",
    "combine_ranges",
    "is_live",
    "merge_range",
    "merge_raw_range",
    "newest",
]

RawRecord = tuple[bytes | None, bytes | None, int]
"""An undecoded changelog record: ``(key, value, changelog offset)``."""


def newest(a: Change, b: Change) -> Change:
    """The later of two changes of one key (by changelog offset); the reduce function of the merge."""
    return a if a.changelog_offset >= b.changelog_offset else b


def is_live(change: Change) -> bool:
    """Whether a key whose newest change is ``change`` exists in the state."""
    return change.op == PUT


class ChangelogReplayer:
    """Applies changes in changelog order to an in-memory state (rules 1-3 of the module docstring).

    Invariant: ``state`` maps every live key to its newest applied value; ``_last`` is the previous
    change seen (applied or skipped), used by rule 2.
    """

    __slots__ = ("_last", "applied", "committed_offset", "skipped", "state")

    def __init__(
        self, committed_offset: int | None = None, initial: Mapping[bytes, bytes] | None = None
    ) -> None:
        self.committed_offset = committed_offset
        self.state: dict[bytes, bytes] = dict(initial) if initial is not None else {}
        self.applied = 0
        self.skipped = 0
        self._last: Change | None = None

    def apply(self, change: Change) -> None:
        last, self._last = self._last, change
        if change.op == TOMBSTONE:
            if last is not None and last.op == DELETE and last.key == change.key:
                return  # rule 2: repeats the envelope's delete (applied or skipped) -- nothing to do
            self.state.pop(change.key, None)
            self.applied += 1
            return
        if self.committed_offset is not None and change.source_offset >= self.committed_offset:
            self.skipped += 1  # rule 3
            return
        if change.op == PUT:
            self.state[change.key] = change.payload
        else:
            self.state.pop(change.key, None)
        self.applied += 1

    def apply_all(self, changes: Iterable[Change]) -> ChangelogReplayer:
        for change in changes:
            self.apply(change)
        return self


@dataclass(slots=True)
class RangeMergeResult:
    """What one task keeps of the offset range ``[start, end)`` it read.

    Invariants: ``tail_offset`` is the offset of the range's first envelope at or above the source
    bound, or None when there is none; every change in ``newest`` lies before ``tail_offset`` (when
    set); ``newest`` holds, per key, the newest such change (deletes included: they must shadow older
    puts of other ranges); ``records`` counts the records read (the reader stops at the tail).
    """

    newest: dict[bytes, Change]
    tail_offset: int | None
    records: int


def merge_range(changes: Iterable[Change], source_bound: int | None) -> RangeMergeResult:
    """Keep the newest change per key of one offset range, stopping at the first uncommitted envelope.

    ``changes`` are in offset order; the iteration stops early (the caller's reader
    may stop reading too) at the first envelope whose source offset is ``>= source_bound``.
    """
    out: dict[bytes, Change] = {}
    last: Change | None = None
    records = 0
    for change in changes:
        if change.op != TOMBSTONE and source_bound is not None and change.source_offset >= source_bound:
            return RangeMergeResult(out, change.changelog_offset, records)
        records += 1
        if change.op == TOMBSTONE and last is not None and last.op == DELETE and last.key == change.key:
            last = change
            continue  # rule 2; the D envelope is already the key's newest change
        last = change
        out[change.key] = change
    return RangeMergeResult(out, None, records)


def merge_raw_range(
    batches: Iterable[Sequence[RawRecord]], source_bound: int | None, where: str = "changelog"
) -> RangeMergeResult:
    """:func:`merge_range` over undecoded records, with the same result (and the same errors).

    The Spark read task's hot path: per record it unpacks the 16-byte envelope header only, keeps the
    newest ``(offset, value)`` per key, and builds :class:`Change` tuples only for the kept records
    (one per key) at the end. A record that is not a well-formed put or delete envelope (a null
    tombstone, a corrupt value) takes the slow path through :func:`decode_change`.

    1. Stop at the first envelope whose source offset is ``>= source_bound`` (its offset is the tail).
    2. Per key the newest record wins; a tombstone right after its key's ``D`` envelope is skipped.
    3. Decode the kept records.
    """
    unpack = HEADER_STRUCT.unpack_from
    kept: dict[bytes, tuple[int, bytes | None]] = {}
    decoded: dict[bytes, Change] = {}  # kept records that took the slow path (already decoded)
    last_delete: bytes | None = None  # key of the previous record when it was a D envelope
    records = 0
    tail: int | None = None
    bound = source_bound
    for batch in batches:
        for key, value, offset in batch:
            if key is not None and value is not None and len(value) >= HEADER_SIZE:
                magic, op, src, _h = unpack(value)
                if magic == MAGIC and src >= 0 and (op == b"P" or (op == b"D" and len(value) == HEADER_SIZE)):
                    # 1.
                    if bound is not None and src >= bound:
                        tail = offset
                        break
                    # 2.
                    records += 1
                    kept[key] = (offset, value)
                    decoded.pop(key, None)
                    last_delete = key if op == b"D" else None
                    continue
            try:
                change = decode_change(key, value, offset)
            except ChangelogFormatError as exc:
                raise ChangelogFormatError(f"{where}: {exc}") from exc
            if change.op != TOMBSTONE and bound is not None and change.source_offset >= bound:
                tail = offset  # unreachable for well-formed envelopes (fast path); kept for safety
                break
            records += 1
            if change.op == TOMBSTONE and last_delete is not None and last_delete == change.key:
                last_delete = None
                continue
            last_delete = change.key if change.op == DELETE else None
            kept[change.key] = (offset, None)
            decoded[change.key] = change
        if tail is not None:
            break
    # 3. (the fast-path records were checked in step 2: build their Change from the header directly)
    out: dict[bytes, Change] = {}
    for key, (offset, value) in kept.items():
        d = decoded.get(key)
        if d is not None:
            out[key] = d
            continue
        assert value is not None  # only slow-path records (in ``decoded``) are kept without a value
        _magic, op, src, h = unpack(value)
        if op == b"P":
            out[key] = Change(key, PUT, src, h, value[HEADER_SIZE:], offset)
        else:
            out[key] = Change(key, DELETE, src, h, b"", offset)
    return RangeMergeResult(out, tail, records)


@dataclass(slots=True)
class CombinedPartition:
    """A partition's snapshot content: live keys' newest changes, and where restore resumes."""

    live: dict[bytes, Change]
    changelog_offset: int


def combine_ranges(results: Sequence[RangeMergeResult], end: int) -> CombinedPartition:
    """Combine one partition's range results (the reference for the distributed merge).

    1. The snapshot's changelog offset is the smallest range tail (``end`` when no range has one).
    2. Changes at or above it are dropped (they belong to the tail restore replays).
    3. The newest remaining change per key wins; keys whose newest change is a delete are dropped.
    """
    # 1.
    tail = min([r.tail_offset for r in results if r.tail_offset is not None], default=end)
    # 2. + 3.
    best: dict[bytes, Change] = {}
    for r in results:
        for key, change in r.newest.items():
            if change.changelog_offset >= tail:
                continue
            prev = best.get(key)
            best[key] = change if prev is None else newest(prev, change)
    return CombinedPartition({k: c for k, c in best.items() if is_live(c)}, tail)


def live_items(changes: Mapping[bytes, Change]) -> Iterator[tuple[bytes, bytes]]:
    """``(key, value)`` of the live changes of a merged mapping."""
    for key, change in changes.items():
        if is_live(change):
            yield key, change.payload
