"""Outputs tied to commits: ``ctx.produce`` on a worker, and the producer whose acknowledgements gate a
record. Does I/O (a confluent-kafka producer, polled on the engine's loop, or by a thread without one).

How an output is tied to its input's commit (steps 1-4, in :func:`with_outputs`):

1. Each attempt gets a fresh :class:`RecordOutputs` as ``ctx.outputs``; ``ctx.produce`` hands every
   output to the worker's one :class:`OutputProducer` (idempotent, ``acks=all``) and counts it.
2. The processor returns.
3. The wrapper waits until the broker acknowledged (or refused) every output of the attempt, lending
   its runner's place to the next record meanwhile (:func:`multilane.worker.lanes.lend_slot`: the
   in-flight bound counts records being processed, not records waiting for acknowledgements). The
   delivery reports are served on the engine's loop, on demand (``poll(0)`` once per loop turn while
   outputs are out, see :class:`OutputProducer`): a report resolves its async waiter's future directly,
   and sets a sync waiter's ``threading.Event``. Without a loop, a poll thread serves them instead.
4. Only then does the wrapper return, so the engine counts the record complete and may commit its
   offset. A refused output raises :class:`OutputDeliveryError` instead: the attempt failed, and the
   record follows its retry and dead-letter policy like any other failure (outputs acknowledged before
   the failure are sent again by the retry: duplicates, never a loss).

Ordering: with ``ordering=key`` a lane runs one record of a key at a time and the next one starts only
when the previous returned, i.e. after its outputs were acknowledged; the idempotent producer keeps the
order of one attempt's outputs within an output partition. So the outputs of one input key reach each
output partition in input order (a kill -9 replays from the committed offset: a new incarnation may
repeat outputs, never reorder one incarnation's). ``partition`` mode: the same per input partition.
``unordered``: no order.

Exactly-once (transactions) is not implemented: outputs are at-least-once (see docs/outputs.md).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from multilane.api import Context, Processor, Record, is_async_processor, needs_state, processor_needs_state
from multilane.worker.lanes import lend_slot

__all__ = ["OutputDeliveryError", "OutputProducer", "RecordOutputs", "output_producer_config", "with_outputs"]

log = logging.getLogger(__name__)


class OutputDeliveryError(Exception):
    """An output of the record was not acknowledged by the broker (retried like any failure)."""


def output_producer_config(bootstrap: str, client_id: str, linger_ms: float = 1.0,
                           security: Mapping[str, str] | None = None,
                           extra: Mapping[str, str] | None = None, idempotent: bool = True) -> dict[str, Any]:
    """Settings of the output producer (pure): ``acks=all``, a short linger (a record waits for its
    outputs' acknowledgement, so linger adds to its latency), the worker's security settings, then
    ``extra`` (``--output-config``) on top.

    ``idempotent`` (``--output-idempotence``): the client's retries neither duplicate nor reorder.
    Without it, one request in flight per broker keeps an attempt's outputs in order within a partition
    across retries (a retry may duplicate one: outputs are at-least-once anyway). The order of
    different records' outputs comes from waiting for acknowledgements, either way.
    """
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "client.id": client_id,
        "enable.idempotence": idempotent,
        "acks": "all",
        "linger.ms": linger_ms,
        "message.timeout.ms": 30_000,
    }
    if not idempotent:
        conf["max.in.flight.requests.per.connection"] = 1
    conf.update(security or {})
    conf.update(extra or {})
    return conf


class RecordOutputs:
    """The outputs of one processing attempt (an :class:`~multilane.api.OutputSink`).

    Invariants: ``produced`` is written only by the processor's thread, ``finished`` and ``error`` only
    by the thread serving delivery reports (the loop, or the poll thread); ``waker`` is set before
    ``sealed`` becomes True, and ``sealed`` only after the processor returned (``produced`` is final
    then). The attempt is settled when ``sealed`` and ``finished == produced``.
    """

    __slots__ = ("_out", "_produce", "error", "finished", "produced", "sealed", "waker")

    def __init__(self, out: OutputProducer) -> None:
        self._out = out
        self._produce = out.produce_now
        self.produced = 0
        self.finished = 0
        self.error: Any = None
        self.sealed = False
        self.waker: Any = None  # asyncio.Future (async processors) or threading.Event (sync)

    def produce(self, topic: str, value: bytes | None, key: bytes | None,
                headers: list[tuple[str, bytes]]) -> None:
        self.produced += 1
        try:
            # the client's produce, straight (one call per output); a full queue takes the slow path
            self._produce(topic, value, key, headers=headers or None, on_delivery=self.delivered)
        except BufferError:
            try:
                self._out.send(self, topic, value, key, headers)
            except BaseException:
                self.produced -= 1
                raise
            return
        except BaseException:
            self.produced -= 1
            raise
        out = self._out
        out.sent += 1
        if not out.polling:
            out.ensure_polling()

    def delivered(self, err: Any, _msg: Any) -> None:
        """Delivery report (on the thread serving them)."""
        if err is not None and self.error is None:
            self.error = err
        self.finished += 1
        if self.sealed and self.finished == self.produced:
            self._out.wake(self)

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise OutputDeliveryError(f"an output of this attempt (of {self.produced}) was not "
                                      f"acknowledged: {self.error}")


class OutputProducer:
    """The worker's one output producer (idempotent) and whoever serves its delivery reports (steps 1-3).

    1. :meth:`start` picks who serves the delivery reports. With a ``loop`` (the engine's) and
       ``poll_on_loop`` (the default): the loop itself, on demand: while outputs are unacknowledged,
       ``poll(0)`` runs once per loop turn (after a turn that served reports) or after ``loop_idle_s``
       (after one that served none); nothing runs while no output is out. Reports then resolve the
       waiters' futures directly: no thread, no GIL hand-over per report, no cross-thread wake-up.
       Otherwise a poll thread serves them and wakes async waiters with one ``call_soon_threadsafe``
       per poll.
    2. :meth:`send` (through :meth:`RecordOutputs.produce`) produces, from any thread, and makes sure
       the reports are being served (a send from another thread arms the loop's poller thread-safely).
    3. :meth:`close` stops serving and flushes (after the engine stopped).

    ``producer``: a confluent-kafka ``Producer`` (or a double with ``produce``/``poll``/``flush``;
    ``len(producer)``, the client's count of outputs not yet reported, when it has one). One loop:
    every async processor using it runs on the same event loop (the engine's).
    """

    def __init__(self, producer: Any, poll_timeout_s: float = 0.05,
                 buffer_wait_s: float = 5.0, poll_on_loop: bool = True, loop_idle_s: float = 0.0005) -> None:
        self._producer = producer
        self.produce_now = producer.produce
        self._outstanding: Callable[[], int] = (producer.__len__ if hasattr(producer, "__len__")
                                                else (lambda: 1))
        self._poll_on_loop = poll_on_loop
        self._loop_idle_s = loop_idle_s
        self._poll_timeout_s = poll_timeout_s
        self._buffer_wait_s = buffer_wait_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0  # ident of the loop's thread while the loop serves reports, else 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._start_lock = threading.Lock()
        # True while reports are being served (the poll thread runs, or the loop's poller is armed);
        # written by start/ensure_polling/_serve_on_loop; producers read it without a lock (see
        # ensure_polling for why a stale read is safe)
        self.polling = False
        # async attempts settled off the loop's thread (poll thread, or close): woken in one hop
        self._settled: list[RecordOutputs] = []
        self.sent = 0  # outputs handed to the producer (diagnostics; approximate with sync processors)

    @classmethod
    def from_config(cls, conf: Mapping[str, Any], **kwargs: Any) -> OutputProducer:
        from confluent_kafka import Producer

        return cls(Producer(dict(conf)), **kwargs)

    # 1.
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Pick who serves delivery reports (idempotent; the first send starts it too). ``loop``: the
        loop of the async processors (default: the caller's running loop, if any). With
        ``poll_on_loop`` and a loop, the loop serves them on demand; otherwise a thread polls."""
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        with self._start_lock:
            if self._stop.is_set() or self._thread is not None or self._loop_thread:
                return
            if loop is not None:
                self._loop = loop
            if self._poll_on_loop and loop is not None:
                if _running_on(loop):
                    self._loop_thread = threading.get_ident()
                else:  # started from another thread, or before the loop runs: learn its thread there
                    loop.call_soon_threadsafe(self._adopt_loop_thread)
                return
            self.polling = True
            self._thread = threading.Thread(target=self._poll_thread, name="multilane-outputs", daemon=True)
            self._thread.start()

    def _adopt_loop_thread(self) -> None:
        self._loop_thread = threading.get_ident()
        self.ensure_polling()

    def ensure_polling(self) -> None:
        """Make sure delivery reports are served (after a produce). Safe against a stale ``polling``:
        the loop's poller clears ``polling`` and only then reads ``len(producer)``, and a sender
        produces before it reads ``polling``; so either the sender sees False and arms the poller, or
        the poller sees the sender's output and stays armed."""
        if not self._loop_thread and self._thread is None:
            self.start()  # the first send: pick who serves (a thread, or the loop: armed below)
        if self._loop_thread:
            if threading.get_ident() == self._loop_thread:
                self._arm()
            elif self._loop is not None and not self._loop.is_closed():
                try:
                    self._loop.call_soon_threadsafe(self._arm)
                except RuntimeError:  # the loop closed meanwhile
                    pass

    def _arm(self) -> None:
        """On the loop: serve reports at the next turn (unless already armed or closed)."""
        if self.polling or self._stop.is_set():
            return
        self.polling = True
        assert self._loop is not None
        self._loop.call_soon(self._serve_on_loop)

    def _serve_on_loop(self) -> None:
        """On the loop: serve the reports that arrived (their waiters' futures resolve inside), then
        re-arm while outputs are out: next turn if this one served reports, else after a pause."""
        if self._stop.is_set():
            self.polling = False
            return
        try:
            served = self._producer.poll(0)
        except Exception:  # pragma: no cover - a client bug must not stop deliveries silently
            log.exception("output producer poll failed")
            served = 0
        loop = self._loop
        assert loop is not None
        if served:
            loop.call_soon(self._serve_on_loop)
            return
        self.polling = False
        if self._outstanding():
            self.polling = True
            loop.call_later(self._loop_idle_s, self._serve_on_loop)

    def _poll_thread(self) -> None:
        poll = self._producer.poll
        timeout = self._poll_timeout_s
        while not self._stop.is_set():
            try:
                poll(timeout)
            except Exception:  # pragma: no cover - a client bug must not stop deliveries silently
                log.exception("output producer poll failed")
                time.sleep(timeout)
            self._flush_settled()

    def _flush_settled(self) -> None:
        if not self._settled:
            return
        settled, self._settled = self._settled, []
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(_resolve_all, settled)
        except RuntimeError:  # the loop closed meanwhile
            pass

    # 2.
    def send(self, outputs: RecordOutputs, topic: str, value: bytes | None, key: bytes | None,
             headers: list[tuple[str, bytes]]) -> None:
        """Produce one output whose report goes to ``outputs``; waits up to ``buffer_wait_s`` while
        the local queue is full (serving reports meanwhile when on the loop's thread), then raises
        BufferError (the attempt fails and is retried)."""
        produce = self._producer.produce
        deadline = 0.0
        while True:
            try:
                produce(topic, value, key, headers=headers or None, on_delivery=outputs.delivered)
                self.sent += 1
                self.ensure_polling()
                return
            except BufferError:
                now = time.monotonic()
                if not deadline:
                    deadline = now + self._buffer_wait_s
                elif now > deadline:
                    raise
                if self._loop_thread and threading.get_ident() == self._loop_thread:
                    self._producer.poll(0.005)  # nobody else serves the reports that free the queue
                else:
                    self.ensure_polling()
                    time.sleep(0.005)  # the poll thread or the loop drains the queue meanwhile

    def wake(self, outputs: RecordOutputs) -> None:
        """``outputs`` is settled (thread serving reports): wake its waiter."""
        waker = outputs.waker
        if isinstance(waker, threading.Event):
            waker.set()
        elif self._loop_thread and threading.get_ident() == self._loop_thread:
            if not waker.done():
                waker.set_result(None)
        else:
            self._settled.append(outputs)

    async def settle_async(self, outputs: RecordOutputs) -> None:
        """Wait (on the loop) until every output of the attempt is acknowledged; raise if one failed."""
        if outputs.finished != outputs.produced:
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()  # before the attempt is sealed
            fut = loop.create_future()
            outputs.waker = fut
            outputs.sealed = True
            if outputs.finished != outputs.produced:
                await fut
        outputs.raise_if_failed()

    def settle_sync(self, outputs: RecordOutputs) -> None:
        """Wait (on the processor's thread) until every output is acknowledged; raise if one failed."""
        event = threading.Event()
        outputs.waker = event
        outputs.sealed = True
        if outputs.finished != outputs.produced:
            while not event.wait(1.0):
                if self._stop.is_set() and not self.polling and self._thread is None:
                    raise OutputDeliveryError("the output producer closed before the outputs were "
                                              "acknowledged")
        outputs.raise_if_failed()

    # 3.
    def close(self, timeout_s: float = 10.0) -> int:
        """Stop serving, flush what is queued (reports run here), close; returns outputs left unsent."""
        self._stop.set()
        loop = self._loop
        if self._loop_thread and threading.get_ident() != self._loop_thread and loop is not None \
                and loop.is_running():
            # the loop's poller: let a poll in progress finish first (reports served by one thread)
            passed = threading.Event()
            try:
                loop.call_soon_threadsafe(passed.set)
                passed.wait(timeout_s)
            except RuntimeError:  # the loop closed meanwhile
                pass
        self.polling = False  # a poller still scheduled finds _stop set and returns
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        left = int(self._producer.flush(timeout_s))
        self._flush_settled()
        close = getattr(self._producer, "close", None)
        if close is not None:
            try:
                close()
            except Exception as exc:  # closing after a lost broker
                log.debug("output producer close: %s", exc)
        if left:
            log.warning("%d output(s) not acknowledged at shutdown (their records were not committed)",
                        left)
        return left


def _running_on(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _resolve_all(settled: list[RecordOutputs]) -> None:
    """On the loop: wake the async waiters of settled attempts."""
    for outputs in settled:
        fut = outputs.waker
        if fut is not None and not fut.done():
            fut.set_result(None)


def with_outputs(processor: Processor, out: OutputProducer) -> Processor:
    """``processor`` with ``ctx.produce`` wired to ``out``; it returns only once every output of the
    attempt is acknowledged (steps 1-4 of the module docstring). Keeps the processor's kind (sync or
    async) and its ``@needs_state`` mark."""
    wrapped: Callable[..., Any]
    if is_async_processor(processor):
        async_proc: Any = processor
        settle_async = out.settle_async

        async def run_with_outputs_async(record: Record, ctx: Context) -> None:
            # 1.
            sink = ctx.outputs = RecordOutputs(out)
            # 2.
            await async_proc(record, ctx)
            # 3.-4. (the wait lends the runner's place to the next record: lanes.lend_slot)
            if sink.produced:
                # a wait ahead (not every output acknowledged yet): lend the place meanwhile
                lane = lend_slot() if sink.finished != sink.produced else None
                try:
                    await settle_async(sink)
                finally:
                    if lane is not None:
                        lane.unlend()

        wrapped = run_with_outputs_async
    else:
        sync_proc: Any = processor
        settle_sync = out.settle_sync

        def run_with_outputs(record: Record, ctx: Context) -> None:
            sink = ctx.outputs = RecordOutputs(out)
            sync_proc(record, ctx)
            if sink.produced:
                settle_sync(sink)

        wrapped = run_with_outputs
    functools.update_wrapper(wrapped, processor)
    if processor_needs_state(processor):
        needs_state(wrapped)
    return wrapped
