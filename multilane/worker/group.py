"""Group mode (``subscribe()`` with the cooperative-sticky assignor): the rebalance callbacks, a thin
adapter onto the ownership protocol of :mod:`multilane.worker.ownership` (its blocking driver). They
run inside ``consume()``, on the engine's loop thread, and block it while they work. Does I/O."""

from __future__ import annotations

import logging
from typing import Any

from multilane.worker.ownership import Ownership
from multilane.worker.partition_set import PartitionSet

__all__ = ["GroupRebalance"]

log = logging.getLogger(__name__)


class GroupRebalance:
    """``on_assign`` / ``on_revoke`` / ``on_lost`` of the group consumer."""

    def __init__(self, partitions: PartitionSet, ownership: Ownership) -> None:
        self._partitions = partitions
        self._ownership = ownership

    def on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        """Cooperative assign: the ownership protocol's add, blocking."""
        tps = [(tp.topic, tp.partition) for tp in partitions
               if (tp.topic, tp.partition) not in self._partitions]
        if tps:
            self._ownership.add_blocking(tps, consumer)

    def on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        """Cooperative revoke: the ownership protocol's release (final commit with progress), blocking."""
        tps = [(tp.topic, tp.partition) for tp in partitions]
        self._partitions.settle(tps)
        parts = self._partitions.owned(tps)
        if parts:
            self._ownership.release_blocking(parts, consumer)

    def on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        """Partitions lost (session expired): drop them without committing."""
        tps = [(tp.topic, tp.partition) for tp in partitions]
        self._partitions.settle(tps)
        self._ownership.drop_lost(tps)
        log.warning("group lost %s", tps)
