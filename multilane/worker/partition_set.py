"""``PartitionSet``: the partitions one worker engine owns, the ones whose state is opening or closing,
and the ones a reopen still has to add back. Bookkeeping with no I/O of its own (it holds the
futures of background closes but starts none).

It is the only writer of these fields (``tests/unit/test_partition_set.py`` checks the source); the
ownership protocol (:mod:`multilane.worker.ownership`) decides *when* to add or forget a partition,
this class keeps the sets consistent with each other and with the flow bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from typing import Any

from multilane.worker.config import TopicPartitionId
from multilane.worker.flow import FlowController
from multilane.worker.partition import PartitionRuntime, Phase

__all__ = ["PartitionSet"]


class PartitionSet:
    """Who is owned, opening, closing or waiting for a reopen. Call on the engine's loop thread."""

    def __init__(self, flow: FlowController) -> None:
        self._flow = flow
        # The partitions this engine owns (any phase). Invariant: ``flow``'s partition count equals
        # its length; shared read-only with the fetch loop (``runtimes``).
        self._parts: dict[TopicPartitionId, PartitionRuntime] = {}
        # Partitions whose state is being opened (restore or promotion) before they join ``_parts``.
        # Invariant: disjoint from ``_parts``; an entry lives exactly while its open_partition runs.
        self._opening: set[TopicPartitionId] = set()
        # State closes running after a release answered. Invariant: an entry lives until its close
        # finished or someone waited for it (opening or learning the partition again, and stop()).
        self._closing: dict[TopicPartitionId, asyncio.Future[Any]] = {}
        # Partitions a reopen released and has not added back yet (its add failed and is retried).
        # Invariant: disjoint from ``_parts``; any control call or rebalance that decides a
        # partition's ownership removes it (the reopen then stops retrying).
        self._reopen_pending: set[TopicPartitionId] = set()
        # Processed counts of the partitions released so far (for processed_total). Never decreases.
        self._released_processed = 0

    # -- reads ------------------------------------------------------------------------------------------

    @property
    def runtimes(self) -> dict[TopicPartitionId, PartitionRuntime]:
        """The owned partitions by ``(topic, partition)``: the fetch loop's read-only view (never
        written outside this class)."""
        return self._parts

    def __contains__(self, tp: object) -> bool:
        return tp in self._parts

    def __len__(self) -> int:
        return len(self._parts)

    def __iter__(self) -> Iterator[PartitionRuntime]:
        return iter(list(self._parts.values()))

    def get(self, tp: TopicPartitionId) -> PartitionRuntime | None:
        return self._parts.get(tp)

    def owned(self, tps: Iterable[TopicPartitionId] | None = None) -> list[PartitionRuntime]:
        """The owned runtimes (of ``tps`` when given, in their order)."""
        if tps is None:
            return list(self._parts.values())
        return [self._parts[tp] for tp in tps if tp in self._parts]

    def active(self) -> list[PartitionRuntime]:
        return [p for p in self._parts.values() if p.phase == Phase.ACTIVE]

    def topics(self) -> set[str]:
        return {t for t, _ in self._parts}

    def opening(self) -> list[TopicPartitionId]:
        return sorted(self._opening)

    def processed_total(self) -> int:
        return self._released_processed + sum(p.processed for p in self._parts.values())

    def reopen_pending(self, tp: TopicPartitionId) -> bool:
        return tp in self._reopen_pending

    # -- writes -----------------------------------------------------------------------------------------

    def add(self, part: PartitionRuntime) -> None:
        """Own ``part`` (its state is open; its lanes start next)."""
        self._parts[(part.topic, part.partition)] = part
        self._flow.set_partitions(len(self._parts))

    def forget(self, part: PartitionRuntime) -> None:
        """Stop owning ``part`` (released, revoked or lost); its processed count stays counted."""
        if self._parts.get((part.topic, part.partition)) is part:
            del self._parts[(part.topic, part.partition)]
            self._released_processed += part.processed
        self._flow.set_partitions(len(self._parts))

    def start_opening(self, tps: Iterable[TopicPartitionId]) -> None:
        self._opening.update(tps)

    def end_opening(self, tps: Iterable[TopicPartitionId]) -> None:
        self._opening.difference_update(tps)

    def closing_started(self, tp: TopicPartitionId, fut: asyncio.Future[Any]) -> None:
        """A state close of ``tp`` runs in the background (after a release answered)."""
        self._closing[tp] = fut

    def take_closing(self, tps: Iterable[TopicPartitionId]) -> list[asyncio.Future[Any]]:
        """The background closes of ``tps`` (forgotten here: the caller waits for them)."""
        return [f for tp in tps if (f := self._closing.pop(tp, None)) is not None]

    def all_closing(self) -> list[TopicPartitionId]:
        return list(self._closing)

    def mark_reopen_pending(self, tp: TopicPartitionId) -> None:
        self._reopen_pending.add(tp)

    def settle(self, tps: Iterable[TopicPartitionId] | None = None) -> None:
        """Ownership of ``tps`` (all when None) was decided: no reopen adds them back any more."""
        if tps is None:
            self._reopen_pending.clear()
        else:
            self._reopen_pending.difference_update(tps)
