"""Apache Kafka in the tests: skip when it cannot run here, fail loudly under ``CI=true``."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

from multilane.testing.apache import ApacheKafkaUnavailableError, find_java, kafka_jars_dir


def unavailable(exc: ApacheKafkaUnavailableError) -> NoReturn:
    """Skip the test with the reason (which names the script to run); under ``CI=true``, fail it."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"Apache Kafka is needed under CI=true: {exc}")
    pytest.skip(f"Apache Kafka cannot run here: {exc}")


def require_apache_kafka() -> None:
    """Java and the broker's jars are here, or the test is skipped (failed under ``CI=true``)."""
    try:
        find_java()
        kafka_jars_dir()
    except ApacheKafkaUnavailableError as exc:
        unavailable(exc)
