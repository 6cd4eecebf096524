"""The public processor API: what a user's processing function receives.

Pure: no I/O. The engine builds :class:`Record` and :class:`Context` objects; user code only reads them
(and uses ``ctx.state`` when the worker runs with a state store, ``ctx.produce`` when it has outputs).

Errors a processor raises: :class:`NonRetryable` (and its :class:`DecodeError`) go to the dead-letter
topic at once; other exceptions are retried (``--retry-on`` narrows which), then dead-lettered.
Loading checks a processor's signature (:func:`check_processor`), so a bad deploy stops before it
consumes anything; :func:`needs_state` marks a processor that cannot run without a state store.
"""

from __future__ import annotations

import importlib
import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, TypeVar

__all__ = [
    "AsyncProcessor",
    "Context",
    "DecodeError",
    "NonRetryable",
    "OrderingMode",
    "OutputSink",
    "OutputsNotAvailableError",
    "Processor",
    "ProcessorLoadError",
    "ProcessorSignatureError",
    "Record",
    "StateView",
    "SyncProcessor",
    "check_processor",
    "is_async_processor",
    "load_object",
    "load_processor",
    "needs_state",
    "processor_needs_state",
]


class NonRetryable(Exception):  # noqa: N818 (the name says what it means to the engine)
    """Raise it (or a subclass) from a processor: the record goes to the dead-letter topic at once.

    Use it for errors that no retry can fix (a malformed record, a rule the record breaks). Its
    dead letter carries the header ``multilane.error.reason: non-retryable``.
    """


class DecodeError(NonRetryable):
    """A record's key or value does not decode in its format (``--key-format`` / ``--value-format``,
    :meth:`Record.json`). Dead-lettered at once with ``multilane.error.reason: decode-error``."""


class OrderingMode(StrEnum):
    """How records of one partition may run beside each other.

    - ``KEY``: records of one key run one at a time, in offset order; different keys run concurrently.
    - ``PARTITION``: one record at a time per partition, in offset order.
    - ``UNORDERED``: any record beside any other, bounded by the concurrency limit.
    """

    KEY = "key"
    PARTITION = "partition"
    UNORDERED = "unordered"


@dataclass(slots=True)
class Record:
    """One Kafka record as the processor sees it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp_ms: int = 0

    # The decoded views below are methods and properties only (no fields): the engine's records stay
    # as small as they were. ``multilane.codecs.DecodedRecord`` overrides them with decoded values.

    @property
    def decoded_key(self) -> Any:
        """The key in the worker's ``--key-format`` (the raw bytes with the default ``bytes``)."""
        return self.key

    @property
    def decoded_value(self) -> Any:
        """The value in the worker's ``--value-format`` (the raw bytes with the default ``bytes``)."""
        return self.value

    def json(self) -> Any:
        """The value parsed as JSON (UTF-8); :class:`DecodeError` when it is missing or not JSON."""
        if self.value is None:
            raise DecodeError(f"{self.topic}[{self.partition}]@{self.offset}: value is null, not JSON")
        try:
            return json.loads(self.value)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DecodeError(f"{self.topic}[{self.partition}]@{self.offset}: value is not JSON: {exc}") \
                from exc

    def text(self) -> str | None:
        """The value decoded as UTF-8 (None for a null value); :class:`DecodeError` when it is not."""
        if self.value is None:
            return None
        try:
            return self.value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"{self.topic}[{self.partition}]@{self.offset}: value is not UTF-8: {exc}") \
                from exc


class StateView(Protocol):
    """Per-key state of the record's key range (provided by ``multilane.worker.state``)."""

    def get(self, key: bytes | None = None) -> bytes | None: ...
    def put(self, value: bytes, key: bytes | None = None) -> None: ...
    def delete(self, key: bytes | None = None) -> None: ...
    def get_json(self, key: bytes | None = None) -> Any: ...
    def put_json(self, value: Any, key: bytes | None = None) -> None: ...


@dataclass(slots=True)
class Context:
    """Where and how a record is being processed: one object per processing attempt.

    A processor may keep it after returning; its fields then never change. (The engine reuses a
    Context only once nothing refers to it any more.)
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    headers: list[tuple[str, bytes]]
    lane: int
    attempt: int  # 1 for the first attempt, 2 for the first retry, ...
    state: StateView | None = None
    # Where ``produce`` sends outputs; None on a worker without an output producer (set by the engine
    # or the test harness, never by user code).
    outputs: OutputSink | None = None

    def produce(self, topic: str, value: bytes | str | None, key: bytes | str | None = None,
                headers: list[tuple[str, bytes]] | None = None) -> None:
        """Send an output record, tied to this record: the record counts as complete (and its offset
        may be committed) only once every output it produced is acknowledged. ``str`` keys and values
        are sent as UTF-8. Usable from sync and async processors (it does not block).

        Raises :class:`OutputsNotAvailableError` on a worker with no output producer.
        """
        sink = self.outputs
        if sink is None:
            raise OutputsNotAvailableError(
                f"ctx.produce({topic!r}, ...): this worker has no output producer "
                "(multilane worker --outputs off, or an Engine whose processor is not wrapped by "
                "multilane.worker.outputs.with_outputs)")
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"ctx.produce: topic must be a non-empty str, got {topic!r}")
        sink.produce(topic, _as_bytes(value, "value"), _as_bytes(key, "key"), list(headers or ()))


def _as_bytes(data: bytes | str | None, what: str) -> bytes | None:
    if data is None or isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"ctx.produce: {what} must be bytes, str or None, got {type(data).__name__} "
                    "(encode objects first, e.g. json.dumps(obj))")


class OutputSink(Protocol):
    """Receives ``ctx.produce`` calls (the engine's output producer, or the test harness's capture)."""

    def produce(self, topic: str, value: bytes | None, key: bytes | None,
                headers: list[tuple[str, bytes]]) -> None: ...


class OutputsNotAvailableError(NotImplementedError):
    """``ctx.produce`` on a worker that has no output producer."""


_F = TypeVar("_F")

SyncProcessor = Callable[[Record, Context], None]
AsyncProcessor = Callable[[Record, Context], Awaitable[None]]
Processor = SyncProcessor | AsyncProcessor


class ProcessorLoadError(ValueError):
    """A ``module:function`` processor spec could not be resolved to a callable."""


class ProcessorSignatureError(ProcessorLoadError):
    """The processor cannot be called as ``processor(record, ctx)``."""


_NEEDS_STATE = "__multilane_needs_state__"


def needs_state(fn: _F) -> _F:
    """Decorator: this processor uses ``ctx.state``; a worker without ``--state-dir`` refuses to start."""
    setattr(fn, _NEEDS_STATE, True)
    return fn


def processor_needs_state(fn: object) -> bool:
    """True when ``fn`` was marked with :func:`needs_state` (or runs in an ``App(state=True)``)."""
    return bool(getattr(fn, _NEEDS_STATE, False))


def check_processor(fn: object, name: str = "processor") -> None:
    """Raise :class:`ProcessorSignatureError` unless ``fn(record, ctx)`` is a valid call (steps 1-3).

    1. It is callable and not a generator function (whose body would never run).
    2. It takes two positional arguments: at least two positional parameters (or ``*args``), and at
       most two without a default.
    3. Every keyword-only parameter has a default.
    """
    # 1. callable, not a generator
    if not callable(fn):
        raise ProcessorSignatureError(f"{name} is a {type(fn).__name__}, not a function")
    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else type(fn).__call__
    if inspect.isasyncgenfunction(target) or inspect.isgeneratorfunction(target):
        raise ProcessorSignatureError(f"{name} is a generator function; define it as "
                                      "'def f(record, ctx)' or 'async def f(record, ctx)'")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # no signature to check (some builtins): let it run
    # 2. two positional arguments
    params = list(sig.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    star = any(p.kind is p.VAR_POSITIONAL for p in params)
    kind = "async def" if is_async_processor(fn) else "def"
    shown = f"{kind} {getattr(fn, '__name__', name)}{sig}"
    if (len(positional) < 2 and not star) or len(required) > 2:
        raise ProcessorSignatureError(
            f"{name} {shown} must take two arguments (record, ctx): '{kind} f(record, ctx)'")
    # 3. keyword-only parameters need defaults
    kw_required = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    if kw_required:
        raise ProcessorSignatureError(
            f"{name} {shown}: keyword-only parameter(s) {', '.join(kw_required)} need a default")


def is_async_processor(fn: object) -> bool:
    """True when ``fn`` is an ``async def`` function (or a callable object with one as ``__call__``)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def load_object(spec: str, what: str = "processor") -> Any:
    """Resolve ``"package.module:attr[.attr...]"`` to the object it names; ProcessorLoadError if not."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        shape = "function" if what == "processor" else "name"
        raise ProcessorLoadError(f"{what} {spec!r} must look like 'package.module:{shape}'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ProcessorLoadError(f"{what} {spec!r}: cannot import {module_name!r}: {exc} "
                                 "(is its directory on PYTHONPATH?)") from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise ProcessorLoadError(f"{what} {spec!r}: {module_name!r} has no {attr!r}") from exc
    return obj


def load_processor(spec: str) -> Processor:
    """Resolve ``"package.module:function"`` to the processor it names, and check its signature.

    Raises :class:`ProcessorLoadError` (:class:`ProcessorSignatureError` for a wrong signature) with a
    message that says what is wrong with the spec.
    """
    obj = load_object(spec)
    if not callable(obj):
        raise ProcessorLoadError(f"processor {spec!r} names a {type(obj).__name__}, not a function")
    check_processor(obj, f"processor {spec!r}")
    return obj  # type: ignore[no-any-return,unused-ignore]
