"""The worker's readiness (``GET /readyz``, the pod's readiness probe): the engine started and every
assigned partition restored (none still being opened)."""

from __future__ import annotations

import asyncio
from typing import Any

from multilane.worker.control import readiness


class _Engine:
    def __init__(self, started: bool, phases: list[str], fenced: bool = False) -> None:
        self.ready = asyncio.Event()
        if started:
            self.ready.set()
        self._status = {
            "fenced": fenced,
            "partitions": [{"topic": "t", "partition": i, "phase": ph} for i, ph in enumerate(phases)],
        }

    def status(self) -> dict[str, Any]:
        return self._status


def test_not_ready_while_the_engine_starts() -> None:
    assert readiness(_Engine(False, [])) == (False, "engine starting")  # type: ignore[arg-type]


def test_ready_when_started_and_every_partition_active() -> None:
    assert readiness(_Engine(True, [])) == (True, "")  # type: ignore[arg-type]
    assert readiness(_Engine(True, ["active", "active"])) == (True, "")  # type: ignore[arg-type]


def test_not_ready_while_a_partition_is_restored() -> None:
    ready, reason = readiness(_Engine(True, ["active", "promoting"]))  # type: ignore[arg-type]
    assert not ready and reason == "restoring t/1"


def test_not_ready_when_fenced() -> None:
    assert readiness(_Engine(True, ["active"], fenced=True))[0] is False  # type: ignore[arg-type]
