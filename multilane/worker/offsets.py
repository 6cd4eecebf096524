"""The per-partition sliding window of fetched offsets and the committable offset.

Pure: no I/O. One :class:`OffsetTracker` per assigned partition. The engine tells it every offset it
fetched (:meth:`OffsetTracker.add`, in increasing order; gaps are allowed because compaction,
transaction markers and brokers that skip empty values leave holes) and every offset whose record is
finished (:meth:`OffsetTracker.complete`, in any order). :meth:`OffsetTracker.committable` is the
offset that may be committed: the first fetched offset not completed, or the next fetch position when
every fetched offset is complete. It never passes an incomplete offset.

Gaps after the newest fetched record (a transaction's commit marker, records compacted away at the
end of what was read) are no record any fetch returns, so no completion ever covers them: committing
"newest record + 1" would stay short of the end for good (KAFKA-6607). The consumer's position steps
over them; :meth:`OffsetTracker.skip_to` moves the next fetch position there once the engine knows no
record below it is still unseen (the end-of-partition event, ``multilane.worker.fetch``).

Cost: ``add`` and ``complete`` are O(1); ``committable`` is amortised O(1) per record, because each
offset leaves the head of the window exactly once (Decaton's ``OutOfOrderCommitControl`` idea). The
bulk forms (``add_many``, ``complete_many``, the slide in ``committable``) run their per-offset loops
inside C (``deque.extend``, ``set.update``, ``takewhile``): the engine calls them once per fetched run,
completion batch and commit cycle, not once per record.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from itertools import repeat, takewhile
from operator import call

__all__ = ["OffsetError", "OffsetTracker"]


class OffsetError(ValueError):
    """An offset was added out of order, or completed without having been added."""


class OffsetTracker:
    """Sliding window over the fetched, not yet committable offsets of one partition."""

    __slots__ = ("_done", "_next", "_window")

    def __init__(self, start: int | None = None) -> None:
        # Fetched offsets in increasing order, from the first one not known complete (the head) to
        # the newest fetched one. Invariant: strictly increasing; every element >= the last value
        # returned by committable(); after committable() runs, the head (if any) is not in _done.
        self._window: deque[int] = deque()
        # Completed offsets that are still in _window. Invariant: _done is a subset of _window's set.
        self._done: set[int] = set()
        # Next fetch position: one past the newest added offset, or the start position before any
        # add, or further where skip_to() said the offsets in between hold no record. None until
        # known. Invariant: when _window is non-empty, _next > _window[-1].
        self._next: int | None = start

    # -- feeding ---------------------------------------------------------------------------------

    def add(self, offset: int) -> None:
        """Record that ``offset`` was fetched; offsets must strictly increase (gaps allowed)."""
        nxt = self._next
        if nxt is not None and offset < nxt:
            raise OffsetError(f"offset {offset} added after position {nxt}: offsets must increase")
        self._window.append(offset)
        self._next = offset + 1

    def add_many(self, offsets: list[int]) -> None:
        """Add several offsets at once; they must strictly increase (checked at the ends only:
        the engine passes offsets of one fetch run, which Kafka delivers in increasing order)."""
        if not offsets:
            return
        nxt = self._next
        if nxt is not None and offsets[0] < nxt:
            raise OffsetError(f"offset {offsets[0]} added after position {nxt}: offsets must increase")
        if offsets[-1] < offsets[0]:
            raise OffsetError("offsets passed to add_many must increase")
        self._window.extend(offsets)
        self._next = offsets[-1] + 1

    def add_completed(self, offset: int) -> None:
        """Record a fetched offset that needs no processing (e.g. progress says it was done)."""
        self.add(offset)
        self._done.add(offset)

    def complete(self, offset: int) -> None:
        """Mark a fetched offset finished. Completing an offset twice is harmless.

        Precondition: ``offset`` was added (checked cheaply: it must lie in the window or below it).
        """
        window = self._window
        if window and window[0] <= offset <= window[-1]:
            self._done.add(offset)
            return
        nxt = self._next
        if nxt is not None and offset < nxt and (not window or offset < window[0]):
            return  # it already slid out of the window: completed before
        raise OffsetError(f"offset {offset} completed but never added")

    def complete_many(self, offsets: Iterable[int]) -> None:
        """Mark several offsets finished (bulk form of :meth:`complete`).

        When every offset lies in the window (the usual case) they are added in one ``set.update``;
        otherwise each goes through :meth:`complete` (which checks it).
        """
        window = self._window
        batch = offsets if isinstance(offsets, list) else list(offsets)
        if not batch:
            return
        if window and window[0] <= min(batch) and max(batch) <= window[-1]:
            self._done.update(batch)
            return
        for o in batch:
            self.complete(o)

    def skip_to(self, position: int) -> bool:
        """The consumer's position is ``position`` and every record below it was added: the offsets
        from the next fetch position up to ``position`` hold no record (transaction markers,
        compacted-away records). Move the next fetch position there (never back); True if it moved.

        Precondition (the caller's to keep): no record below ``position`` was fetched and left out.
        """
        nxt = self._next
        if nxt is not None and position <= nxt:
            return False  # also every position at or below a fetched offset (nxt is above them)
        self._next = position
        return True

    def reset(self, position: int) -> None:
        """Forget everything and restart at ``position`` (after a seek)."""
        self._window.clear()
        self._done.clear()
        self._next = position

    # -- reading ---------------------------------------------------------------------------------

    def committable(self) -> int | None:
        """The offset to commit: first incomplete fetched offset, else the next fetch position.

        None while the position is unknown (nothing fetched and no start given).
        """
        window = self._window
        done = self._done
        # Slide: drop completed offsets from the head; each offset is dropped once in its life. The
        # completed head is found and forgotten by C loops (takewhile, difference_update).
        if window and window[0] in done:
            head = list(takewhile(done.__contains__, window))
            done.difference_update(head)
            if len(head) == len(window):
                window.clear()
            else:  # popleft len(head) times inside C (deque() with maxlen 0 only consumes)
                deque(map(call, repeat(window.popleft, len(head))), 0)
        if window:
            return window[0]
        return self._next

    @property
    def position(self) -> int | None:
        """The next fetch position (one past the newest fetched offset, or where :meth:`skip_to` moved
        it), or None when unknown."""
        return self._next

    @property
    def pending(self) -> int:
        """How many fetched offsets are in the window and not completed."""
        return len(self._window) - len(self._done)

    def completed_above(self, base: int) -> list[int]:
        """Sorted completed offsets ``>= base`` still in the window (for unordered-mode progress)."""
        window = self._window
        if window and base <= window[0]:
            return sorted(self._done)  # every completed offset in the window is >= its head
        return sorted(o for o in self._done if o >= base)

    def is_complete(self, offset: int) -> bool:
        """True when ``offset`` is known complete (below the window head counts as complete)."""
        window = self._window
        if window and offset < window[0]:
            return True
        if not window:
            return self._next is not None and offset < self._next
        return offset in self._done

    def __repr__(self) -> str:
        return (
            f"OffsetTracker(committable={self.committable()}, position={self._next}, "
            f"pending={self.pending})"
        )
