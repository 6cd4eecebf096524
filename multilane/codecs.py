"""Key and value formats (``--key-format`` / ``--value-format``) and the decode step before a processor.

Pure: no I/O (a ``module:callable`` hook is imported once, when the format is resolved).

- A *codec* turns raw bytes (or None) into what the processor reads: :class:`BytesCodec` (unchanged,
  the default), :class:`StrCodec` (UTF-8), :class:`JsonCodec` (UTF-8 JSON), or a user's own function
  named ``package.module:callable`` (:class:`HookCodec`), which takes ``bytes | None`` and returns the
  decoded object, raising any exception on bad input.
- :class:`RecordDecoder` decodes a record's key and value into a :class:`DecodedRecord` (a
  :class:`~multilane.api.Record` whose ``decoded_key`` / ``decoded_value`` / ``json()`` give the decoded
  objects; ``key`` and ``value`` stay the raw bytes). Any decode failure is a
  :class:`~multilane.api.DecodeError`: not retried, dead-lettered with ``multilane.error.reason:
  decode-error``.
- :func:`decoding_processor` wraps a processor so that it receives decoded records. The worker applies
  it when loading the processor (no engine change): with both formats ``bytes`` the processor is
  returned unchanged, so the default costs nothing per record.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from multilane.api import (
    Context,
    DecodeError,
    Processor,
    ProcessorLoadError,
    Record,
    is_async_processor,
    load_object,
    needs_state,
    processor_needs_state,
)

__all__ = [
    "FORMATS",
    "BytesCodec",
    "Codec",
    "CodecError",
    "DecodedRecord",
    "HookCodec",
    "JsonCodec",
    "RecordDecoder",
    "StrCodec",
    "decoding_processor",
    "load_codec",
]

FORMATS = ("bytes", "str", "json")  # the built-in formats; anything with a ':' is a hook


class CodecError(ValueError):
    """A format name that is neither built in nor a loadable ``module:callable``."""


class Codec(Protocol):
    """Decodes the raw bytes of a key or value. Raises any exception on bad input."""

    @property
    def name(self) -> str: ...

    def decode(self, data: bytes | None) -> Any: ...


class BytesCodec:
    """The raw bytes, unchanged (the default)."""

    name = "bytes"

    def decode(self, data: bytes | None) -> Any:
        return data


class StrCodec:
    """UTF-8 text; None stays None."""

    name = "str"

    def decode(self, data: bytes | None) -> Any:
        return None if data is None else data.decode("utf-8")


class JsonCodec:
    """UTF-8 JSON; None stays None (a tombstone has no value to parse)."""

    name = "json"

    def decode(self, data: bytes | None) -> Any:
        return None if data is None else json.loads(data)


@dataclass(frozen=True)
class HookCodec:
    """A user's decode function, ``package.module:callable`` taking ``bytes | None``."""

    name: str
    fn: Callable[[bytes | None], Any]

    def decode(self, data: bytes | None) -> Any:
        return self.fn(data)


_BUILT_IN: dict[str, Codec] = {"bytes": BytesCodec(), "str": StrCodec(), "json": JsonCodec()}


def load_codec(spec: str) -> Codec:
    """The codec named ``spec``: ``bytes``, ``str``, ``json`` or ``package.module:callable``."""
    codec = _BUILT_IN.get(spec)
    if codec is not None:
        return codec
    if ":" not in spec:
        raise CodecError(f"format {spec!r} must be one of {', '.join(FORMATS)} or 'package.module:callable'")
    try:
        fn = load_object(spec, "format")
    except ProcessorLoadError as exc:
        raise CodecError(str(exc)) from exc
    if not callable(fn):
        raise CodecError(f"format {spec!r} names a {type(fn).__name__}, not a callable")
    return HookCodec(spec, fn)


class DecodedRecord(Record):
    """A record with its key and value decoded (what a processor gets with ``--key/value-format``).

    ``key`` and ``value`` stay the raw bytes (the dead-letter topic gets them unchanged).
    """

    __slots__ = ("_decoded_key", "_decoded_value", "_value_is_json")

    def __init__(self, record: Record, decoded_key: Any, decoded_value: Any, value_is_json: bool) -> None:
        Record.__init__(self, record.topic, record.partition, record.offset, record.key, record.value,
                        record.headers, record.timestamp_ms)
        self._decoded_key = decoded_key
        self._decoded_value = decoded_value
        self._value_is_json = value_is_json

    @property
    def decoded_key(self) -> Any:
        return self._decoded_key

    @property
    def decoded_value(self) -> Any:
        return self._decoded_value

    def json(self) -> Any:
        if self._value_is_json and self._decoded_value is not None:
            return self._decoded_value  # parsed once, by the decode step
        return Record.json(self)


@dataclass(frozen=True)
class RecordDecoder:
    """Decodes records in the worker's key and value formats."""

    key_codec: Codec = _BUILT_IN["bytes"]
    value_codec: Codec = _BUILT_IN["bytes"]

    @classmethod
    def from_formats(cls, key_format: str = "bytes", value_format: str = "bytes") -> RecordDecoder:
        return cls(load_codec(key_format), load_codec(value_format))

    @property
    def identity(self) -> bool:
        """True when decoding changes nothing (both formats ``bytes``)."""
        return isinstance(self.key_codec, BytesCodec) and isinstance(self.value_codec, BytesCodec)

    def decode(self, record: Record) -> DecodedRecord:
        """The record with its key and value decoded; :class:`DecodeError` naming the part and format."""
        where = f"{record.topic}[{record.partition}]@{record.offset}"
        try:
            key = self.key_codec.decode(record.key)
        except Exception as exc:
            raise DecodeError(f"{where}: key is not {self.key_codec.name}: {exc}") from exc
        try:
            value = self.value_codec.decode(record.value)
        except Exception as exc:
            raise DecodeError(f"{where}: value is not {self.value_codec.name}: {exc}") from exc
        return DecodedRecord(record, key, value, isinstance(self.value_codec, JsonCodec))


def decoding_processor(processor: Processor, decoder: RecordDecoder) -> Processor:
    """``processor`` receiving records decoded by ``decoder``; ``processor`` itself when nothing decodes.

    Where the decode happens: just before the processor is called, inside the attempt, so a
    :class:`DecodeError` is the attempt's failure and follows the error policy (dead letter, no
    retry). The wrapper keeps the processor's kind (sync or async) and its ``@needs_state`` mark.
    """
    if decoder.identity:
        return processor
    decode = decoder.decode
    wrapped: Processor
    if is_async_processor(processor):
        async_proc: Any = processor

        async def decode_then_run_async(record: Record, ctx: Context) -> None:
            await async_proc(decode(record), ctx)

        wrapped = decode_then_run_async
    else:
        sync_proc: Any = processor

        def decode_then_run(record: Record, ctx: Context) -> None:
            sync_proc(decode(record), ctx)

        wrapped = decode_then_run
    functools.update_wrapper(wrapped, processor)
    if processor_needs_state(processor):
        needs_state(wrapped)
    return wrapped
