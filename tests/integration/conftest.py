"""Fixtures of the integration tests (beside ``tests/conftest.py``'s broker and topic names)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from multilane.testing.workers import WorkerProcess


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    """Every ``WorkerProcess`` a test appends here is stopped at teardown."""
    started: list[WorkerProcess] = []
    yield started
    for w in started:
        w.stop()
