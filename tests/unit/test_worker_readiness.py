"""The worker's readiness (``GET /readyz``, the pod's readiness probe): the engine's facts (started,
fenced, every assigned partition restored) and the supervisor's, decided by one function."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from multilane.worker.control import engine_facts
from multilane.worker.readiness import ReadinessFacts, readiness


class _Engine:
    def __init__(self, started: bool, phases: list[str], fenced: bool = False) -> None:
        self.ready = asyncio.Event()
        if started:
            self.ready.set()
        self.status_calls = 0
        self._status = {
            "fenced": fenced,
            "partitions": [{"topic": "t", "partition": i, "phase": ph} for i, ph in enumerate(phases)],
        }

    def status(self) -> dict[str, Any]:
        self.status_calls += 1
        return self._status


def _decide(engine: _Engine) -> tuple[bool, list[str]]:
    r = readiness(engine_facts(engine))  # type: ignore[arg-type]
    return r.ready, list(r.reasons)


def test_not_ready_while_the_engine_starts_and_its_status_is_not_read() -> None:
    engine = _Engine(False, ["promoting"], fenced=True)
    assert _decide(engine) == (False, ["starting"])
    assert engine.status_calls == 0


def test_ready_when_started_and_every_partition_active() -> None:
    assert _decide(_Engine(True, [])) == (True, [])
    assert _decide(_Engine(True, ["active", "active"])) == (True, [])
    assert engine_facts(_Engine(True, ["active", "active"])).partitions == 2  # type: ignore[arg-type]


def test_not_ready_while_a_partition_is_restored() -> None:
    assert _decide(_Engine(True, ["active", "promoting"])) == (False, ["restoring state of t/1"])


def test_at_most_five_restoring_partitions_are_named() -> None:
    ready, reasons = _decide(_Engine(True, ["promoting"] * 7))
    assert not ready and reasons == ["restoring state of t/0, t/1, t/2, t/3, t/4 (+2 more)"]


def test_not_ready_when_fenced() -> None:
    assert _decide(_Engine(True, ["active"], fenced=True)) == (False, ["fenced (lease lost)"])


def test_the_workers_facts_are_laid_over_the_engines_and_every_reason_named_once() -> None:
    facts = engine_facts(_Engine(True, ["promoting"], fenced=True))  # type: ignore[arg-type]
    worker = replace(facts, stopping=True, breaker_open=True, breaker_reason="5 consecutive",
                     expects_partitions=True)
    assert readiness(worker).to_dict() == {"ready": False, "reasons": [
        "stopping", "no partitions assigned yet (--assign)", "restoring state of t/0",
        "circuit breaker open: 5 consecutive", "fenced (lease lost)"]}


def test_a_worker_without_supervisor_facts_is_ready_on_the_engines_alone() -> None:
    assert readiness(ReadinessFacts(started=True)).to_dict() == {"ready": True, "reasons": []}
