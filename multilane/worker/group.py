"""Group mode (``subscribe()`` with the cooperative-sticky assignor): the rebalance callbacks, a small
adapter onto the ownership protocol of :mod:`multilane.worker.ownership`. They run inside
``consume()``, on the engine's loop thread, and block it while they work. Does I/O."""

from __future__ import annotations

import concurrent.futures
import logging
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from multilane.worker.ownership import PartitionOwnership, _fully_committed
from multilane.worker.partition import Phase

__all__ = ["GroupRebalanceAdapter"]

log = logging.getLogger("multilane.worker.engine")


class GroupRebalanceAdapter(PartitionOwnership):
    """``on_assign`` / ``on_revoke`` / ``on_lost`` of the group consumer."""

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        """Cooperative assign: committed offsets, progress, state restore, then assign (blocking)."""
        tps = [(tp.topic, tp.partition) for tp in partitions if (tp.topic, tp.partition) not in self._parts]
        if not tps:
            return
        try:
            committed = self._committed(tps)
        except KafkaException as exc:
            # librdkafka then starts at the committed offset itself; without it no progress is used.
            log.warning("cannot read committed offsets of %s (%s); starting without progress", tps, exc)
            committed = {tp: (None, None) for tp in tps}
        # progress reads in parallel on the I/O threads (this callback blocks the loop meanwhile)
        futs = {tp: self._io_pool.submit(self._load_progress, tp, committed[tp]) for tp in tps}
        progress = {tp: futs[tp].result() for tp in tps}
        if self.hooks is not None:
            # state restores in parallel, all or nothing (as in _open_states)
            hooks = self.hooks
            opens = {
                tp: self._io_pool.submit(hooks.open_partition, tp[0], tp[1], committed[tp][0], progress[tp])
                for tp in tps
            }
            concurrent.futures.wait(list(opens.values()))
            failed = [e for f in opens.values() if (e := f.exception()) is not None]
            if failed:
                for tp, f in opens.items():
                    if f.exception() is None:
                        self._close_state_quietly(tp, False)
                raise failed[0]
        runtimes = [self._new_runtime(tp[0], tp[1], committed[tp][0], progress[tp]) for tp in tps]
        for rt in runtimes:
            self._activate(rt)
        consumer.incremental_assign(
            [
                TopicPartition(rt.topic, rt.partition, rt.committed)
                if rt.committed is not None
                else TopicPartition(rt.topic, rt.partition)
                for rt in runtimes
            ]
        )
        self._resume_assigned(runtimes, consumer)
        log.info("group assigned %s", [f"{rt.topic}/{rt.partition}@{rt.committed}" for rt in runtimes])

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        """Cooperative revoke: stop the lanes and commit completed work with progress (blocking).

        Records still running are abandoned; the progress record lets the next owner replay only
        those (and the queued ones), not what already completed.
        """
        parts = [
            self._parts[(tp.topic, tp.partition)]
            for tp in partitions
            if (tp.topic, tp.partition) in self._parts
        ]
        self._reopen_pending.difference_update((tp.topic, tp.partition) for tp in partitions)
        if not parts:
            return
        # clean close only for partitions with nothing abandoned and a successful commit (below)
        clean = {id(p): p.in_flight == 0 for p in parts}
        for p in parts:
            p.phase = Phase.RELEASING
            p.close()
        # Records running on the thread pool keep running while the loop is blocked here; wait for
        # them (each batch stops after its current record) so the next owner never overlaps a key.
        batches = [f for p in parts for f in p.lanes.batches_running()]
        if batches:
            _done, pending = concurrent.futures.wait(batches, timeout=self.config.drain_timeout_s)
            if pending:
                log.warning("%d thread-pool batches still running after revoke", len(pending))
        assert self._commits is not None
        try:
            for p in self._commits.run_blocking(parts, self._producer):
                clean[id(p)] = False
        except Exception as exc:
            log.warning("commit on revoke failed: %s", exc)
            clean = dict.fromkeys(clean, False)
        for p in parts:
            self._close_state_quietly((p.topic, p.partition), clean[id(p)] and _fully_committed(p))
            self._parts.pop((p.topic, p.partition), None)
            self._flow.set_partitions(len(self._parts))
            self._released_total += p.processed
        log.info("group revoked %s", [(p.topic, p.partition, p.committed) for p in parts])

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        """Partitions lost (session expired): drop them without committing."""
        self._reopen_pending.difference_update((tp.topic, tp.partition) for tp in partitions)
        for tp in partitions:
            p = self._parts.pop((tp.topic, tp.partition), None)
            self._flow.set_partitions(len(self._parts))
            if p is not None:
                p.close()
                self._released_total += p.processed
                if self.hooks is not None:
                    self.hooks.close_partition(p.topic, p.partition, False)
        log.warning("group lost %s", [(tp.topic, tp.partition) for tp in partitions])
