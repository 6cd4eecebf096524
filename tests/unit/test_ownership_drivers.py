"""The ownership protocol runs once, over two I/O drivers: under the blocking one a protocol coroutine
runs to its end without an event loop (its awaitables are already resolved)."""

from __future__ import annotations

import asyncio

import pytest

from multilane.worker.ownership_io import Ready, ready_call, run_now


async def _steps(log: list[str]) -> int:
    log.append("1")
    a = await Ready(2)
    log.append("2")
    b = await ready_call(lambda x: x * 10, 4)
    log.append("3")
    return a + b


def test_a_coroutine_over_ready_awaitables_runs_to_its_end_at_once() -> None:
    log: list[str] = []
    assert run_now(_steps(log)) == 42
    assert log == ["1", "2", "3"]


def test_an_error_of_a_blocking_call_is_raised_where_it_is_awaited() -> None:
    async def step() -> str:
        try:
            await ready_call(int, "not a number")
        except ValueError:
            return "caught at the await"
        return "not raised"

    assert run_now(step()) == "caught at the await"


def test_a_step_that_would_suspend_is_refused() -> None:
    async def suspends() -> None:
        await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="suspended"):
        run_now(suspends())
