"""Shared pytest fixtures: one embedded broker per test session, unique topic names."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from multilane.testing.broker import EmbeddedBroker

# Under pytest-xdist: session-wide checks on the controller; the longest modules first.
pytest_plugins = ["tests.support.after_workers", "tests.support.xdist_order"]

# Property tests check behaviour, not speed: no per-example deadline, so a loaded 2-core machine (CI
# beside other work) cannot fail them by timing alone.
settings.register_profile("multilane", deadline=None)
settings.load_profile("multilane")

_topic_ids = itertools.count()


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    """A broker shared by the session; tests isolate themselves by unique topic and group names."""
    b = EmbeddedBroker()
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique within the session, derived from the test's name."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60]
    return f"t-{base}-{os.getpid()}-{next(_topic_ids)}"
