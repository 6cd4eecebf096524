"""``run_processor``: run a processor on in-memory records, for a user's unit tests. No I/O of its own
(only what the processor does).

It applies what a worker applies -- the signature check, ``@needs_state``, the key and value formats,
the error policy (retries, ``NonRetryable``, ``retry_on``, dead letters with the worker's headers) --
with in-memory state (:class:`~multilane.testing.memory_state.MemoryStateView`, a dict) and captured
outputs (``ctx.produce``), and returns a :class:`ProcessorRun` to assert on. Records run one at a
time in the order given (a valid order in every ordering mode); retries run at once (no backoff).

Differences from a worker, on purpose: outputs of a failed attempt are dropped (a worker without
transactions may already have sent them: make outputs idempotent or keyed); state writes of a failed
attempt stay (as in the worker's store).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from multilane.api import (
    Context,
    Processor,
    Record,
    check_processor,
    is_async_processor,
    processor_needs_state,
)
from multilane.codecs import RecordDecoder, decoding_processor
from multilane.testing.memory_state import MemoryStateView
from multilane.worker.retry import RetryPolicy, dead_letter_headers

if TYPE_CHECKING:
    from multilane.app import App

__all__ = ["DeadLetter", "Output", "ProcessorRun", "RunOptions", "make_records",
           "run_processor", "run_processor_async"]

RecordLike = Record | tuple[Any, Any] | bytes | str | Mapping[str, Any] | list[Any] | None


@dataclass(frozen=True)
class Output:
    """One ``ctx.produce`` call of a successful attempt."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    source: Record  # the input record whose processing produced it

    def json(self) -> Any:
        return None if self.value is None else json.loads(self.value)


@dataclass(frozen=True)
class DeadLetter:
    """A record the worker would send to the dead-letter topic."""

    record: Record
    error: BaseException
    # the multilane.error.reason header: decode-error, non-retryable, not-retried, retries-exhausted
    reason: str
    attempts: int
    headers: list[tuple[str, bytes]]  # the dead letter's headers, as the worker writes them


@dataclass
class ProcessorRun:
    """What :func:`run_processor` saw. Every input record is in exactly one of ``processed`` and
    ``dead_letters``."""

    processed: list[Record] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    outputs: list[Output] = field(default_factory=list)
    state: MutableMapping[bytes, bytes] | None = None  # the store after the run (None: no state)
    attempts: dict[int, int] = field(default_factory=dict)  # input offset -> attempts made
    retries: int = 0

    def outputs_to(self, topic: str) -> list[Output]:
        return [o for o in self.outputs if o.topic == topic]

    def state_json(self, key: bytes | str) -> Any:
        """The state value of ``key`` parsed as JSON (None when absent)."""
        if self.state is None:
            raise ValueError("this run had no state (pass state={} or mark the processor @needs_state)")
        raw = self.state.get(key.encode() if isinstance(key, str) else key)
        return None if raw is None else json.loads(raw)

    @property
    def reasons(self) -> list[str]:
        return [d.reason for d in self.dead_letters]


class _Capture:
    """The ``ctx.outputs`` of one attempt: kept only when the attempt succeeds."""

    def __init__(self, source: Record) -> None:
        self.source = source
        self.sent: list[Output] = []

    def produce(self, topic: str, value: bytes | None, key: bytes | None,
                headers: list[tuple[str, bytes]]) -> None:
        self.sent.append(Output(topic, key, value, headers, self.source))


def _encode(data: Any) -> bytes | None:
    if data is None or isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode("utf-8")
    return json.dumps(data, separators=(",", ":")).encode()


def make_records(items: Iterable[RecordLike], topic: str = "input", partition: int = 0) -> list[Record]:
    """Records from ``Record`` objects, ``(key, value)`` pairs or bare values (str as UTF-8, dicts and
    lists as JSON); offsets count from 0 in the order given (a ``Record`` keeps its own)."""
    out: list[Record] = []
    for offset, item in enumerate(items):
        if isinstance(item, Record):
            out.append(item)
            continue
        key, value = item if isinstance(item, tuple) else (None, item)
        out.append(Record(topic, partition, offset, _encode(key), _encode(value), [], 0))
    return out


def _unpack_app(processor: Any, key_format: str | None,
                value_format: str | None) -> tuple[Processor, str, str]:
    """A :class:`multilane.App` gives its processor and its formats (unless given here)."""
    from multilane.app import App

    if isinstance(processor, App):
        defaults = processor.worker_defaults
        return (processor.get_processor(), key_format or defaults.get("key_format", "bytes"),
                value_format or defaults.get("value_format", "bytes"))
    return processor, key_format or "bytes", value_format or "bytes"


class RunOptions(TypedDict, total=False):
    """The options of :func:`run_processor` and :func:`run_processor_async` (keywords; default)."""

    state: MutableMapping[bytes, bytes] | None  # the store, a dict to pre-fill and inspect (None)
    key_format: str | None  # key format (None: the App's, else "bytes")
    value_format: str | None  # value format (None: the App's, else "bytes")
    max_retries: int  # retries of a failed record before it is dead-lettered (3)
    retry_on: tuple[type[BaseException], ...]  # the exception types retried ((Exception,))
    topic: str  # the topic of records made from plain values ("input")


async def run_processor_async(processor: Processor | App, records: Iterable[RecordLike],
                              **options: Unpack[RunOptions]) -> ProcessorRun:
    """:func:`run_processor` from a running event loop (``await`` it in an async test)."""
    # 1. what the worker checks at start (and the options, which only a type checker sees otherwise)
    unknown = sorted(set(options) - RunOptions.__optional_keys__)
    if unknown:
        raise TypeError(f"run_processor: unknown option(s) {', '.join(unknown)} "
                        f"(known: {', '.join(RunOptions.__annotations__)})")
    processor, key_format, value_format = _unpack_app(processor, options.get("key_format"),
                                                      options.get("value_format"))
    check_processor(processor)
    state = options.get("state")
    if state is None and processor_needs_state(processor):
        state = {}
    run_fn = decoding_processor(processor, RecordDecoder.from_formats(key_format, value_format))
    is_async = is_async_processor(run_fn)
    policy = RetryPolicy(max_retries=options.get("max_retries", 3), base_ms=0,
                         retry_on=options.get("retry_on", (Exception,)))
    result = ProcessorRun(state=state)
    # 2. each record in order, with the error policy
    for record in make_records(records, options.get("topic", "input")):
        attempt = 1
        while True:
            capture = _Capture(record)
            ctx = Context(record.topic, record.partition, record.offset, record.key, record.headers, 0,
                          attempt)
            ctx.outputs = capture
            if state is not None:
                ctx.state = MemoryStateView(state, record.key,
                                            f"{record.topic}[{record.partition}]@{record.offset}")
            try:
                if is_async:
                    await run_fn(record, ctx)  # type: ignore[misc]
                else:
                    run_fn(record, ctx)
            except Exception as exc:
                if policy.should_retry(attempt, exc):
                    result.retries += 1
                    attempt += 1
                    continue
                reason = policy.reason(exc)
                result.dead_letters.append(DeadLetter(record, exc, reason, attempt,
                                                      dead_letter_headers(record, exc, attempt, reason)))
            else:
                result.processed.append(record)
                result.outputs.extend(capture.sent)
            result.attempts[record.offset] = attempt
            break
    return result


def run_processor(processor: Processor | App, records: Iterable[RecordLike],
                  **options: Unpack[RunOptions]) -> ProcessorRun:
    """Run ``processor`` (sync or async, or a :class:`multilane.App`'s) on ``records`` as a worker would
    (steps 1-2).

    1. Check it as a worker does at start (signature); a ``@needs_state`` processor gets an empty
       store when ``state`` is not given.
    2. Run each record in order: decoded per ``key_format`` / ``value_format``; ``ctx.state`` over
       ``state`` (a dict you can pre-fill and inspect), ``ctx.produce`` captured; a failure is retried
       up to ``max_retries`` times if ``retry_on`` says so and it is not ``NonRetryable``, then
       dead-lettered.

    The options (:class:`RunOptions`) are those of :func:`run_processor_async`, which does the work.

    Inside a running event loop use ``await run_processor_async(...)``.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("run_processor() called from a running event loop: use "
                           "'await run_processor_async(...)' instead")
    return asyncio.run(run_processor_async(processor, records, **options))
