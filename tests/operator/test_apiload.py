"""Quiet on the API server: at steady state the real kopf operator sends no more than 2 requests per
consumer per minute and posts no Event (``benchmarks/apiload.py``'s measurement, small)."""

from __future__ import annotations

import pytest

from benchmarks.apiload import _measure

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def test_steady_state_costs_at_most_two_requests_per_consumer_per_minute() -> None:
    row = await _measure(3, 12.0)
    assert row["per_consumer_min"] <= 2.0, row
    assert row["events_per_hour"] == 0, row
