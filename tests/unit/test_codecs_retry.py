"""Decode step and error policy: codecs, the decoding wrapper, which failures are retried, the
dead-letter reason header, the retry log (DEBUG each, one INFO summary a minute), ``--help`` defaults."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from multilane.api import Context, DecodeError, NonRetryable, Record, needs_state, processor_needs_state
from multilane.codecs import CodecError, DecodedRecord, RecordDecoder, decoding_processor, load_codec
from multilane.worker.cli import parse_retry_on
from multilane.worker.config import ConfigError, EngineConfig
from multilane.worker.retry import (
    REASON_HEADER,
    DeadLetterPublisher,
    RetryLog,
    RetryPolicy,
    failure_reason,
)

ROOT = Path(__file__).resolve().parents[2]


def rec(value: bytes | None, key: bytes | None = b"k") -> Record:
    return Record("orders", 2, 17, key, value, [("h", b"1")], 5)


def ctx() -> Context:
    return Context("orders", 2, 17, b"k", [], 0, 1)


def upper(data: bytes | None) -> str:
    if data is None or not data.isalpha():
        raise ValueError("not letters")
    return data.decode().upper()


def test_built_in_codecs() -> None:
    assert load_codec("bytes").decode(b"\xff") == b"\xff"
    assert load_codec("str").decode("é".encode()) == "é"
    assert load_codec("json").decode(b'{"a": [1]}') == {"a": [1]}
    assert load_codec("json").decode(None) is None
    assert load_codec(f"{__name__}:upper").decode(b"abc") == "ABC"
    with pytest.raises(CodecError, match="one of bytes, str, json"):
        load_codec("yaml")
    with pytest.raises(CodecError, match="has no"):
        load_codec(f"{__name__}:nothing_here")


def test_record_json_and_text() -> None:
    assert rec(b'{"total": 3}').json() == {"total": 3}
    assert rec(b"abc").text() == "abc"
    assert rec(b"abc").decoded_value == b"abc"
    with pytest.raises(DecodeError, match=r"orders\[2\]@17: value is not JSON"):
        rec(b"{not json").json()
    with pytest.raises(DecodeError, match="null"):
        rec(None).json()
    with pytest.raises(DecodeError, match="UTF-8"):
        rec(b"\xff").text()


def test_decoder_decodes_key_and_value_and_names_what_failed() -> None:
    decoder = RecordDecoder.from_formats("str", "json")
    out = decoder.decode(rec(b'{"n": 1}', key=b"cust-1"))
    assert isinstance(out, DecodedRecord) and isinstance(out, Record)
    assert (out.decoded_key, out.decoded_value, out.json()) == ("cust-1", {"n": 1}, {"n": 1})
    assert (out.key, out.value, out.headers, out.timestamp_ms) == (b"cust-1", b'{"n": 1}', [("h", b"1")], 5)
    with pytest.raises(DecodeError, match="value is not json"):
        decoder.decode(rec(b"{oops"))
    with pytest.raises(DecodeError, match="key is not str"):
        decoder.decode(rec(b"{}", key=b"\xff"))
    hooked = RecordDecoder.from_formats(f"{__name__}:upper", "bytes").decode(rec(b"x", key=b"abc"))
    assert hooked.decoded_key == "ABC"


def test_decoding_processor_keeps_kind_and_marks() -> None:
    seen: list[Any] = []

    @needs_state
    def sync_proc(record: Record, c: Context) -> None:
        seen.append(record.decoded_value)

    async def async_proc(record: Record, c: Context) -> None:
        seen.append(record.json())

    identity = RecordDecoder()
    assert decoding_processor(sync_proc, identity) is sync_proc  # the default costs nothing
    decoder = RecordDecoder.from_formats("bytes", "json")
    wrapped_sync = decoding_processor(sync_proc, decoder)
    wrapped_async = decoding_processor(async_proc, decoder)
    assert processor_needs_state(wrapped_sync)
    assert asyncio.iscoroutinefunction(wrapped_async) and not asyncio.iscoroutinefunction(wrapped_sync)
    wrapped_sync(rec(b"[1]"), ctx())
    asyncio.run(wrapped_async(rec(b"[2]"), ctx()))  # type: ignore[arg-type]
    assert seen == [[1], [2]]
    with pytest.raises(DecodeError):
        wrapped_sync(rec(b"nope"), ctx())


def test_retry_policy_never_retries_non_retryable_or_other_types() -> None:
    policy = RetryPolicy(max_retries=3, retry_on=(TimeoutError, ConnectionError))
    assert policy.should_retry(1, TimeoutError("slow"))
    assert policy.should_retry(3, ConnectionError())
    assert not policy.should_retry(4, TimeoutError())  # exhausted
    assert not policy.should_retry(1, ValueError("bug"))  # not a retried type
    assert not policy.should_retry(1, DecodeError("bad json"))
    assert not RetryPolicy(retry_on=(Exception,)).should_retry(1, NonRetryable("rule"))
    assert RetryPolicy().should_retry(1)  # without the exception: the attempt count alone
    assert [policy.reason(e) for e in (DecodeError(), NonRetryable(), ValueError(), TimeoutError())] == [
        "decode-error", "non-retryable", "not-retried", "retries-exhausted"]
    assert failure_reason(KeyError()) == "retries-exhausted"


def test_retry_on_flag_and_config() -> None:
    assert parse_retry_on([]) == (Exception,)
    assert parse_retry_on(["TimeoutError", "multilane.api:NonRetryable"]) == (TimeoutError, NonRetryable)
    with pytest.raises(ConfigError, match="not an exception type"):
        parse_retry_on(["print"])
    with pytest.raises(ConfigError, match="cannot import"):
        parse_retry_on(["nosuch.module:Error"])
    cfg = EngineConfig(bootstrap_servers="b:1", group="g", topics=("t",), retry_on=(OSError,))
    assert RetryPolicy.from_config(cfg).retry_on == (OSError,)
    with pytest.raises(ConfigError, match="retry_on"):
        EngineConfig(bootstrap_servers="b:1", group="g", topics=("t",), retry_on=())


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def produce(self, topic: str, **kw: Any) -> None:
        self.sent.append({"topic": topic, **kw})
        kw["on_delivery"](None, None)


@pytest.mark.parametrize(("exc", "reason", "given"), [
    (DecodeError("bad"), "decode-error", None),
    (NonRetryable("rule"), "non-retryable", None),
    (RuntimeError("boom"), "retries-exhausted", None),
    (RuntimeError("boom"), "not-retried", "not-retried"),
])
def test_dead_letter_names_the_reason(exc: BaseException, reason: str, given: str | None) -> None:
    producer = FakeProducer()
    done: list[int] = []
    dlq = DeadLetterPublisher(producer, lambda t: f"{t}.dlq")
    dlq.publish(rec(b"{oops"), exc, 1, lambda: done.append(1), reason=given)
    assert done == [1] and dlq.pending == 0
    (sent,) = producer.sent
    headers = dict(sent["headers"])
    assert sent["topic"] == "orders.dlq" and sent["value"] == b"{oops"
    assert headers[REASON_HEADER] == reason.encode()
    assert headers["h"] == b"1" and headers["multilane.origin.offset"] == b"17"


def test_retry_log_debug_each_info_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    logger = logging.getLogger("test.retrylog")
    retry_log = RetryLog(logger, interval_s=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.DEBUG, logger="test.retrylog"):
        for i in range(180):  # 3 retries a second for a minute
            now[0] = i / 3
            retry_log.retrying("orders", 0, i, 1, ValueError("x") if i % 2 else TimeoutError(), 0.1)
        now[0] = 61.0
        retry_log.retrying("orders", 0, 999, 2, ValueError("x"), 0.2)
        retry_log.flush()  # nothing new since the summary: no second line
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    info = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(debug) == 181
    assert len(info) == 1
    summary = r"^181 retries in the last 61s \(ValueError x91, TimeoutError x90\)"
    assert re.search(summary, info[0].getMessage())


def test_worker_help_shows_every_default() -> None:
    out = subprocess.run([sys.executable, "-m", "multilane", "worker", "--help"], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300"})
    assert out.returncode == 0
    # one block per option: its line and the indented help lines under it
    options = [" ".join(block.split()) for block in re.split(r"\n(?=  -)", out.stdout.split("options:")[1])]
    options = [o for o in options if o.startswith("--")]
    assert len(options) > 25
    required = ("--bootstrap-servers", "--group", "--processor")
    missing = [o.split()[0] for o in options if "(default:" not in o and not o.strip().startswith(required)]
    assert missing == []
