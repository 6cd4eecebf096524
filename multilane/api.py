"""The public processor API: what a user's processing function receives.

Pure: no I/O. The engine builds :class:`Record` and :class:`Context` objects; user code only reads them
(and uses ``ctx.state`` when the worker runs with a state store).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

__all__ = [
    "AsyncProcessor",
    "Context",
    "OrderingMode",
    "Processor",
    "ProcessorLoadError",
    "Record",
    "StateView",
    "SyncProcessor",
    "is_async_processor",
    "load_processor",
]


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


class StateView(Protocol):
    """Per-key state of the record's key range (provided by ``multilane.worker.state``)."""

    def get(self, key: bytes | None = None) -> bytes | None: ...
    def put(self, value: bytes, key: bytes | None = None) -> None: ...
    def delete(self, key: bytes | None = None) -> None: ...
    def get_json(self, key: bytes | None = None) -> Any: ...
    def put_json(self, value: Any, key: bytes | None = None) -> None: ...


@dataclass(slots=True)
class Context:
    """Where and how a record is being processed: one object per processing attempt."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    headers: list[tuple[str, bytes]]
    lane: int
    attempt: int  # 1 for the first attempt, 2 for the first retry, ...
    state: StateView | None = None


SyncProcessor = Callable[[Record, Context], None]
AsyncProcessor = Callable[[Record, Context], Awaitable[None]]
Processor = SyncProcessor | AsyncProcessor


class ProcessorLoadError(ValueError):
    """A ``module:function`` processor spec could not be resolved to a callable."""


def is_async_processor(fn: object) -> bool:
    """True when ``fn`` is an ``async def`` function (or a callable object with one as ``__call__``)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def load_processor(spec: str) -> Processor:
    """Resolve ``"package.module:function"`` to the processor it names.

    Raises :class:`ProcessorLoadError` with a message that says what is wrong with the spec.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ProcessorLoadError(f"processor {spec!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ProcessorLoadError(f"processor {spec!r}: cannot import {module_name!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise ProcessorLoadError(f"processor {spec!r}: {module_name!r} has no {attr!r}") from exc
    if not callable(obj):
        raise ProcessorLoadError(f"processor {spec!r} names a {type(obj).__name__}, not a function")
    return obj  # type: ignore[no-any-return,unused-ignore]
