"""Exactly-once commits: a partition's commit is its transaction (``--outputs exactly-once``). Does I/O
(through :mod:`multilane.worker.transactions`, on its own commit threads).

:class:`~multilane.worker.commits.CommitCycle` hands its cycles here when the worker has transactional
outputs; both of its drivers (the async one and the blocking one of rebalance callbacks) keep their
step 1 (:func:`~multilane.worker.commits.plan_commit`), and steps 2-4 become, per partition:

1. take the partition's ``turn`` (its previous transaction finished; commits of a partition run one at
   a time, in the order planned);
2. on the loop, with no await between them: plan (flush completions, completed prefix ``C``, progress
   record), then take the held outputs, and with state the held changelog records
   (``take_changes``), of exactly the records the plan counts complete;
3. the transaction (changelog records, outputs, progress record, ``C`` as the committed offset,
   commit), on a commit thread, several partitions in parallel; it releases the turn; on success the
   state learns the commit (``changes_committed``: the changelog end, the committed offset);
4. a partition whose transaction aborted (or was fenced) is returned to the caller: the housekeeping
   loop reopens it, so its records after ``C`` run again (a fenced one is dropped instead, see
   :mod:`multilane.worker.reopen`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

from multilane.worker.hooks import TransactionalStateHooks
from multilane.worker.partition import PartitionRuntime
from multilane.worker.progress_store import ProgressStore, progress_key
from multilane.worker.transactions import (
    PartitionTransaction,
    ProgressTarget,
    TransactionAbortedError,
    TransactionalOutputs,
)

__all__ = ["TransactionCommits"]

log = logging.getLogger(__name__)


class CommitOwner(Protocol):
    """What this driver uses of its :class:`~multilane.worker.commits.CommitCycle`."""

    fenced: bool
    commit_errors: int
    latency: Any

    def plan(self, parts: Sequence[PartitionRuntime], final: bool) -> Any: ...


class TransactionCommits:
    """The commit cycle's transactional drivers (steps 1-4 of the module docstring).

    Invariant: a partition's held outputs are taken only while its ``turn`` is held, right after the
    plan that decided its offset and progress record.
    """

    def __init__(self, transactions: TransactionalOutputs, consumer: Any, store: ProgressStore | None,
                 cycle: CommitOwner, state: TransactionalStateHooks | None = None, threads: int = 8) -> None:
        self._txns = transactions
        self._state = state
        self._consumer = consumer
        self._store = store
        self._cycle = cycle
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads,
                                                           thread_name_prefix="multilane-txn")

    async def run(self, parts: Sequence[PartitionRuntime], final: bool,
                                started: float) -> list[PartitionRuntime]:
        """The async driver with transactions: each partition's turn (commits of a partition in the
        order planned), then steps 1 and 3 of :mod:`multilane.worker.transactions` without an await
        between the plan and the take (the held outputs taken are those of exactly the records the
        plan counts complete), then the transactions in parallel on the commit threads. Returns the
        partitions whose transaction aborted (the caller reopens them; a fenced one is dropped)."""
        txns = self._txns
        assert txns is not None
        turns: list[tuple[PartitionRuntime, PartitionTransaction]] = []
        for part in parts:
            txn = txns.transaction((part.topic, part.partition))
            if txn is None or txn.fenced or txn.broken:
                continue
            if not txn.turn.acquire(blocking=False):  # the partition's previous commit still runs
                await asyncio.to_thread(txn.turn.acquire)
            turns.append((part, txn))
        if self._cycle.fenced:
            for _part, txn in turns:
                txn.turn.release()
            return []
        jobs = self._plan(turns, final)
        loop = asyncio.get_running_loop()
        results = await asyncio.gather(*(loop.run_in_executor(self._pool, *job) for _item, job in jobs),
                                       return_exceptions=True)
        return self._apply([item for item, _job in jobs], results, started)

    def run_blocking(self, parts: Sequence[PartitionRuntime],
                                   started: float) -> list[PartitionRuntime]:
        """The blocking driver with transactions (rebalance callbacks): the same, one by one."""
        txns = self._txns
        assert txns is not None
        turns = []
        for part in parts:
            txn = txns.transaction((part.topic, part.partition))
            usable = txn is not None and not (txn.fenced or txn.broken)
            if usable and txn is not None and txn.turn.acquire(timeout=txns.timeout_s):
                turns.append((part, txn))
        jobs = self._plan(turns, True)
        results: list[Any] = []
        for _item, (fn, *args) in jobs:
            try:
                results.append(fn(*args))
            except Exception as exc:
                results.append(exc)
        return self._apply([item for item, _job in jobs], results, started)

    def _plan(self, turns: list[tuple[PartitionRuntime, PartitionTransaction]],
                           final: bool) -> list[tuple[Any, tuple[Any, ...]]]:
        """On the loop, every turn held, no await: plan, take the held outputs of the records counted
        complete, and build each transaction's call (it releases the turn); turns of partitions with
        nothing to commit are released here."""
        txns = self._txns
        store = self._store
        assert txns is not None
        batch = self._cycle.plan([p for p, _ in turns], final)
        planned = {id(i.part): i for i in batch.items}
        meta = self._consumer.consumer_group_metadata() if batch.items else None
        jobs = []
        for part, txn in turns:
            item = planned.get(id(part))
            if item is None:
                txn.turn.release()
                continue
            outputs = txns.take((part.topic, part.partition), part.tracker.is_complete)
            changes = (self._state.take_changes(part.topic, part.partition, part.tracker.is_complete)
                       if self._state is not None else [])
            progress = None
            if store is not None and item.encoded is not None:
                target = ProgressTarget(store.topic, store.partition_index(part.partition),
                                        progress_key(part.topic, part.partition))
                progress = (target, item.encoded)
            part.commit_sent = item.offset
            jobs.append((item, (txns.commit, txn, outputs, progress, part.topic, part.partition, item.offset,
                                meta, changes)))
        return jobs

    def _apply(self, items: list[Any], results: list[Any],
                            started: float) -> list[PartitionRuntime]:
        lost = []
        for item, result in zip(items, results, strict=True):
            part = item.part
            if isinstance(result, BaseException):
                part.commit_sent = None
                self._cycle.commit_errors += 1
                if isinstance(result, TransactionAbortedError):
                    log.warning("%s/%d: %s; its records after offset %s run again", part.topic,
                                part.partition, result, part.committed)
                else:
                    log.error("%s/%d: transaction failed: %r", part.topic, part.partition, result)
                lost.append(part)
                continue
            part.last_progress = item.encoded
            if self._state is not None:
                self._state.changes_committed(part.topic, part.partition, item.offset, result)
            if part.committed is None or item.offset >= part.committed:
                part.committed = item.offset
            self._cycle.latency.observe(time.monotonic() - started)
        return lost
