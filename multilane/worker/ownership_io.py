"""The two I/O drivers of the ownership protocol (:mod:`multilane.worker.ownership`). Does I/O.

The protocol's steps are written once, as coroutines that await what a driver returns:

- :class:`LoopIo` on the event loop: blocking calls on the I/O threads, waits that yield (operator
  mode, reopen, stop);
- :class:`BlockingIo` inside a rebalance callback, which runs in ``consume()`` and cannot await:
  every step is done before its awaitable (a :class:`Ready`) is returned, so :func:`run_now` runs
  the coroutine to its end without suspending. A blocked loop runs no record, so this driver does
  not wait for running records, and its commit is :meth:`CommitCycle.run_blocking`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from confluent_kafka import Consumer, KafkaException, TopicPartition

from multilane.worker.admin import security_config
from multilane.worker.commits import CommitCycle
from multilane.worker.config import EngineConfig, TopicPartitionId
from multilane.worker.hooks import PartitionStateHooks
from multilane.worker.partition import PartitionRuntime
from multilane.worker.partition_set import PartitionSet

__all__ = ["BlockingIo", "Committed", "LoopIo", "OwnershipIo", "Ready", "close_state_quietly",
           "ready_call", "run_now"]

log = logging.getLogger(__name__)

T = TypeVar("T")
Committed = tuple[int | None, str | None]  # (committed offset or None, commit metadata or None)


class Ready(Generic[T]):
    """An awaitable that is already resolved: awaiting it returns (or raises) without suspending."""

    __slots__ = ("_error", "_value")

    def __init__(self, value: T, error: BaseException | None = None) -> None:
        self._value = value
        self._error = error

    def __await__(self) -> Generator[Any, None, T]:
        if self._error is not None:
            raise self._error
        return self._value
        yield  # a generator, never reached


def ready_call(fn: Callable[..., T], *args: Any) -> Ready[T]:
    """``fn(*args)`` now; its result (or its exception, raised where it is awaited)."""
    try:
        return Ready(fn(*args))
    except Exception as exc:
        return Ready(None, exc)  # type: ignore[arg-type]  # never read: awaiting raises ``exc``


def run_now(coro: Coroutine[Any, Any, T]) -> T:
    """Run a protocol coroutine over :class:`BlockingIo` to its end (it never suspends)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        value: T = stop.value
        return value
    coro.close()
    raise RuntimeError("an ownership step suspended under the blocking driver")


def close_state_quietly(hooks: PartitionStateHooks | None, tp: TopicPartitionId, clean: bool) -> None:
    """``close_partition`` (blocking), logging instead of raising."""
    if hooks is None:
        return
    try:
        hooks.close_partition(tp[0], tp[1], clean)
    except Exception:
        log.exception("close_partition failed for %s/%d", tp[0], tp[1])


def read_committed(tps: list[TopicPartitionId], client: Any) -> dict[TopicPartitionId, Committed]:
    """Committed offsets and metadata of ``tps`` through ``client`` (blocking)."""
    out: dict[TopicPartitionId, Committed] = {}
    for tp in client.committed([TopicPartition(t, p) for t, p in tps], timeout=15):
        out[(tp.topic, tp.partition)] = (tp.offset if tp.offset >= 0 else None,
                                         getattr(tp, "metadata", None))  # older clients lack it
    for tp in tps:
        out.setdefault(tp, (None, None))
    return out


class CommittedReader:
    """Committed offsets via a separate client of the same group, so that the loop keeps processing
    meanwhile (blocking; I/O threads, one read at a time). The client is made at the first read and
    kept until :meth:`close`: a client per read cost a connection and a coordinator lookup (~55 ms
    against ~1 ms) inside the pause of every handoff."""

    def __init__(self, config: EngineConfig) -> None:
        self._config = config
        self._lock = threading.Lock()
        self._client: Any = None  # guarded by _lock; None until the first read and after close()

    def read(self, tps: list[TopicPartitionId]) -> dict[TopicPartitionId, Committed]:
        with self._lock:
            if self._client is None:
                cfg = self._config
                self._client = Consumer({"bootstrap.servers": cfg.bootstrap_servers, "group.id": cfg.group,
                                         "enable.auto.commit": False,
                                         **security_config(cfg.consumer_overrides)})
            return read_committed(tps, self._client)

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


class OwnershipIo(Protocol):
    """How the protocol's steps wait: on the loop, or blocking the loop's thread."""

    commit_errors: tuple[type[Exception], ...]  # final-commit failures that only make the close unclean

    def call(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]: ...
    def each(self, fn: Callable[..., T],
             calls: Sequence[tuple[Any, ...]]) -> Awaitable[list[T | BaseException]]: ...
    def committed(self, tps: list[TopicPartitionId]) -> Awaitable[dict[TopicPartitionId, Committed]]: ...
    def wait_closes(self, tps: Iterable[TopicPartitionId]) -> Awaitable[None]: ...
    def wait_until(self, done: Callable[[], bool], deadline: float, poll_s: float) -> Awaitable[None]: ...
    def wait_batches(self, futs: list[concurrent.futures.Future[Any]],
                     timeout_s: float) -> Awaitable[int]: ...
    def commit_final(self, parts: list[PartitionRuntime]) -> Awaitable[list[PartitionRuntime]]: ...
    def close_state(self, tp: TopicPartitionId, clean: bool, background: bool) -> Awaitable[None]: ...


class LoopIo:
    """The protocol on the event loop: blocking calls on the I/O threads, waits that yield."""

    commit_errors: tuple[type[Exception], ...] = (KafkaException,)  # others propagate to the caller

    def __init__(self, config: EngineConfig, io_pool: concurrent.futures.ThreadPoolExecutor,
                 partitions: PartitionSet, hooks: PartitionStateHooks | None, commits: CommitCycle) -> None:
        self._config = config
        self._pool = io_pool
        self._partitions = partitions
        self._hooks = hooks
        self._commits = commits
        self._committed = CommittedReader(config)

    def close(self) -> None:
        """Close the committed-offset client (blocking; at engine stop)."""
        self._committed.close()

    def call(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]:
        return asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def each(self, fn: Callable[..., T], calls: Sequence[tuple[Any, ...]]) -> list[T | BaseException]:
        return list(await asyncio.gather(*(self.call(fn, *args) for args in calls), return_exceptions=True))

    def committed(self, tps: list[TopicPartitionId]) -> Awaitable[dict[TopicPartitionId, Committed]]:
        return self.call(self._committed.read, tps)

    async def wait_closes(self, tps: Iterable[TopicPartitionId]) -> None:
        pending = self._partitions.take_closing(tps)
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def wait_until(self, done: Callable[[], bool], deadline: float, poll_s: float) -> None:
        while not done() and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(poll_s)

    async def wait_batches(self, futs: list[concurrent.futures.Future[Any]], timeout_s: float) -> int:
        if not futs:
            return 0
        _done, pending = await asyncio.wait([asyncio.wrap_future(f) for f in futs], timeout=timeout_s)
        return len(pending)

    def commit_final(self, parts: list[PartitionRuntime]) -> Awaitable[list[PartitionRuntime]]:
        return self._commits.run(parts, final=True)

    async def close_state(self, tp: TopicPartitionId, clean: bool, background: bool) -> None:
        hooks = self._hooks
        assert hooks is not None
        if background:
            fut = asyncio.ensure_future(self._close_after_answer(hooks, tp, clean))
            self._partitions.closing_started(tp, fut)
        else:
            await self.call(hooks.close_partition, tp[0], tp[1], clean)

    async def _close_after_answer(self, hooks: PartitionStateHooks, tp: TopicPartitionId,
                                  clean: bool) -> None:
        """A background close, handed to the I/O threads only once the releasing call stopped running
        on the loop (this task's first step): starting a thread and the close's Python parts compete
        for the interpreter with the rest of the release and its answer, which ends the first half of
        a handoff's pause."""
        await self.call(close_state_quietly, hooks, tp, clean)


class BlockingIo:
    """The protocol inside a rebalance callback: every step done before its awaitable is returned."""

    commit_errors: tuple[type[Exception], ...] = (Exception,)  # a callback must not raise for a commit

    def __init__(self, io_pool: concurrent.futures.ThreadPoolExecutor, hooks: PartitionStateHooks | None,
                 commits: CommitCycle, producer: Any, consumer: Any) -> None:
        self._pool = io_pool
        self._hooks = hooks
        self._commits = commits
        self._producer = producer
        self._consumer = consumer

    def call(self, fn: Callable[..., T], *args: Any) -> Ready[T]:
        return ready_call(fn, *args)

    def each(self, fn: Callable[..., T], calls: Sequence[tuple[Any, ...]]) -> Ready[list[T | BaseException]]:
        # in parallel on the I/O threads (the callback blocks the loop meanwhile)
        futs = [self._pool.submit(fn, *args) for args in calls]
        concurrent.futures.wait(futs)
        out: list[T | BaseException] = []
        for f in futs:
            exc = f.exception()
            out.append(exc if exc is not None else f.result())
        return Ready(out)

    def committed(self, tps: list[TopicPartitionId]) -> Ready[dict[TopicPartitionId, Committed]]:
        try:
            return Ready(read_committed(tps, self._consumer))
        except KafkaException as exc:
            # librdkafka then starts at the committed offset itself; without it no progress is used.
            log.warning("cannot read committed offsets of %s (%s); starting without progress", tps, exc)
            return Ready({tp: (None, None) for tp in tps})

    def wait_closes(self, tps: Iterable[TopicPartitionId]) -> Ready[None]:
        return Ready(None)  # group mode closes in the callback itself: nothing runs in the background

    def wait_until(self, done: Callable[[], bool], deadline: float, poll_s: float) -> Ready[None]:
        return Ready(None)  # the blocked loop runs no record: waiting would only delay the rebalance

    def wait_batches(self, futs: list[concurrent.futures.Future[Any]], timeout_s: float) -> Ready[int]:
        if not futs:
            return Ready(0)
        _done, pending = concurrent.futures.wait(futs, timeout=timeout_s)
        return Ready(len(pending))

    def commit_final(self, parts: list[PartitionRuntime]) -> Ready[list[PartitionRuntime]]:
        return ready_call(self._commits.run_blocking, parts, self._producer)

    def close_state(self, tp: TopicPartitionId, clean: bool, background: bool) -> Ready[None]:
        close_state_quietly(self._hooks, tp, clean)
        return Ready(None)
