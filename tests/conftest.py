"""Shared pytest fixtures: one broker per test session (``--broker=embedded|apache``), unique topic names.

``--broker=embedded`` (the default) gives the session's tests the embedded Tansu broker;
``--broker=apache`` gives them Apache Kafka (``multilane.testing.apache``), so every test that takes
the ``broker`` fixture runs on either. When Apache Kafka cannot run here (no java, or no jars: run
``bash scripts/kafka-jars.sh``), its tests are skipped with that reason, and fail under ``CI=true``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from multilane.testing.apache import ApacheKafka, ApacheKafkaUnavailableError
from multilane.testing.broker import EmbeddedBroker
from tests.support.apache import unavailable

# Property tests check behaviour, not speed: no per-example deadline, so a loaded 2-core machine (CI
# beside other work) cannot fail them by timing alone.
settings.register_profile("multilane", deadline=None)
settings.load_profile("multilane")

_topic_ids = itertools.count()

# The suite leaves nothing in the temporary directory (the session fails otherwise); under
# pytest-xdist, session-wide checks run on the controller and the longest modules start first.
# A test that outlives its timeout and its teardown ends the process: tests/support/timeout_backstop.py.
pytest_plugins = [
    "tests.support.tempdir_check",
    "tests.support.after_workers",
    "tests.support.xdist_order",
    "tests.support.xdist_groups",
    "tests.support.timeout_backstop",
]


BROKER_KINDS = ("embedded", "apache")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--broker", choices=BROKER_KINDS, default="embedded",
        help="the broker of the session's `broker` fixture: embedded (Tansu, default) or apache "
             "(Apache Kafka from scripts/kafka-jars.sh)",
    )


def pytest_report_header(config: pytest.Config) -> str:
    return f"broker: {config.getoption('--broker')}"


@pytest.fixture(scope="session")
def broker_kind(request: pytest.FixtureRequest) -> str:
    """Which broker the session runs on: ``embedded`` or ``apache`` (``--broker``)."""
    return str(request.config.getoption("--broker"))


@pytest.fixture(scope="session")
def broker(broker_kind: str) -> Iterator[EmbeddedBroker | ApacheKafka]:
    """A broker shared by the session; tests isolate themselves by unique topic and group names."""
    b: EmbeddedBroker | ApacheKafka
    if broker_kind == "apache":
        b = ApacheKafka()
        try:
            b.start()
        except ApacheKafkaUnavailableError as exc:
            unavailable(exc)
    else:
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
