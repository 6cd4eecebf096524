"""``multilane.testing.run_processor``: in-memory records, dict-backed state with the worker's StateView
API and errors, captured outputs, decoding and the error policy."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import multilane
from multilane.api import Context, NonRetryable, ProcessorSignatureError, Record, needs_state
from multilane.testing import MemoryStateView, run_processor, run_processor_async
from multilane.worker.state.errors import StateError, StateKeyError


@needs_state
async def totals(record: Record, ctx: Context) -> None:
    order = record.json()
    if order["amount"] < 0:
        raise NonRetryable(f"negative amount {order['amount']}")
    assert ctx.state is not None
    total = (ctx.state.get_json() or 0) + order["amount"]
    ctx.state.put_json(total)
    ctx.produce("totals", str(total), key=record.key)


def test_state_outputs_and_dead_letters() -> None:
    records = [("alice", {"amount": 5}), ("bob", {"amount": 2}), ("alice", "{broken"),
               ("alice", {"amount": 7}), ("bob", {"amount": -1})]
    run = run_processor(totals, records, value_format="json")
    assert run.state_json("alice") == 12 and run.state_json(b"bob") == 2
    assert [(o.key, o.value) for o in run.outputs_to("totals")] == [
        (b"alice", b"5"), (b"bob", b"2"), (b"alice", b"12")]
    assert run.outputs[2].source.offset == 3
    assert run.reasons == ["decode-error", "non-retryable"]
    assert [d.record.offset for d in run.dead_letters] == [2, 4]
    assert dict(run.dead_letters[0].headers)["multilane.error.reason"] == b"decode-error"
    assert [r.offset for r in run.processed] == [0, 1, 3]
    assert run.retries == 0 and run.attempts == {0: 1, 1: 1, 2: 1, 3: 1, 4: 1}


def test_prefilled_state_and_sync_processor() -> None:
    def count(record: Record, ctx: Context) -> None:
        assert ctx.state is not None
        ctx.state.put(str(int(ctx.state.get() or b"0") + 1).encode())

    store = {b"k": b"41"}
    run = run_processor(count, [(b"k", b"x"), (b"j", b"y")], state=store)
    assert run.state is store and store == {b"k": b"42", b"j": b"1"}


def test_retries_then_dead_letter_and_retry_on() -> None:
    calls: list[int] = []

    def flaky(record: Record, ctx: Context) -> None:
        calls.append(ctx.attempt)
        ctx.produce("out", b"partial")  # outputs of a failed attempt are dropped
        if record.value == b"timeout" and ctx.attempt < 3:
            raise TimeoutError("slow")
        if record.value == b"bug":
            raise KeyError("bug")

    run = run_processor(flaky, [b"timeout", b"bug"], max_retries=3, retry_on=(TimeoutError,))
    assert calls == [1, 2, 3, 1]
    assert run.attempts == {0: 3, 1: 1} and run.retries == 2
    assert run.reasons == ["not-retried"] and len(run.outputs) == 1
    run = run_processor(flaky, [b"bug"], max_retries=2)
    assert run.reasons == ["retries-exhausted"] and run.dead_letters[0].attempts == 3


def test_no_state_unless_needed_and_ctx_state_is_none() -> None:
    seen: list[Any] = []
    run = run_processor(lambda r, c: seen.append(c.state), [b"x"])
    assert seen == [None] and run.state is None
    with pytest.raises(ValueError, match="no state"):
        run.state_json("x")


def test_signature_checked_and_async_variant() -> None:
    with pytest.raises(ProcessorSignatureError):
        run_processor(lambda r: None, [b"x"])  # type: ignore[arg-type]

    async def main() -> None:
        run = await run_processor_async(totals, [("a", {"amount": 1})], value_format="json")
        assert run.state_json("a") == 1
        with pytest.raises(RuntimeError, match="run_processor_async"):
            run_processor(totals, [])

    asyncio.run(main())


def test_app_formats_are_used() -> None:
    app = multilane.App(totals, value_format="json")
    assert run_processor(app, [("a", {"amount": 3})]).state_json("a") == 3


def test_memory_state_view_matches_the_worker_errors() -> None:
    store: dict[bytes, bytes] = {}
    keyless = MemoryStateView(store, None, "t[0]@5")
    with pytest.raises(StateKeyError, match="has no key"):
        keyless.get()
    keyless.put(b"v", key=b"explicit")
    assert keyless.get(b"explicit") == b"v"
    view = MemoryStateView(store, b"k", "t[0]@6")
    with pytest.raises(StateKeyError, match="must be bytes"):
        view.get("k")  # type: ignore[arg-type]
    with pytest.raises(StateKeyError, match="empty"):
        view.put(b"1", key=b"")
    with pytest.raises(TypeError, match="put_json"):
        view.put({"a": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="put_json"):  # the value is named before the key
        view.put("v", key=b"")  # type: ignore[arg-type]
    view.put(bytearray(b"copied"))
    assert type(store[b"k"]) is bytes and store[b"k"] == b"copied"
    view.put(b"not json")
    with pytest.raises(StateError, match="not JSON"):
        view.get_json()
    view.delete()
    assert view.get() is None and store == {b"explicit": b"v"}


def test_ctx_produce_without_an_output_producer_says_so() -> None:
    from multilane.api import OutputsNotAvailableError

    ctx = Context("orders", 0, 3, b"k", [], 0, 1)
    with pytest.raises(OutputsNotAvailableError, match="no output producer"):
        ctx.produce("out", b"v")
    assert issubclass(OutputsNotAvailableError, NotImplementedError)
    run = run_processor(lambda r, c: c.produce("out", "é", key="k", headers=[("h", b"1")]), [b"x"])
    (out,) = run.outputs
    assert (out.topic, out.key, out.value, out.headers) == ("out", b"k", "é".encode(), [("h", b"1")])
    run = run_processor(lambda r, c: c.produce("out", {"a": 1}), [b"x"], max_retries=0)  # type: ignore[arg-type]
    (letter,) = run.dead_letters
    assert isinstance(letter.error, TypeError) and "json.dumps" in str(letter.error)


def test_an_unknown_option_is_refused_in_one_line() -> None:
    with pytest.raises(TypeError, match=r"unknown option.*max_retry .*known: state, key_format"):
        run_processor(lambda r, c: None, [b"x"], max_retry=2)  # type: ignore[call-arg]
