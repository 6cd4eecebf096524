"""``StatusMemory``: a pass writes the status only when its significant part changes or the heartbeat
is due; the next pass reads what it computed."""

from __future__ import annotations

from typing import Any

from multilane.operator.spec.status_memory import StatusMemory, significant


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def body(rv: int, status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": str(rv)}, "status": status}


HOLD = {"replicas": 2, "factor": 4, "rule": "at-recommendation"}


def test_first_pass_writes_then_holds_are_kept_in_memory_until_the_heartbeat() -> None:
    clock = Clock()
    mem = StatusMemory(heartbeat_s=60, clock=clock)
    stored = body(10, {})
    first = {"replicas": 2, "lag": 5, "lastDecision": {**HOLD, "time": "t1"}, "policy": {"w": [1]}}
    patch = mem.to_write("u", stored, first)
    assert patch == first
    mem.written("u", body(11, first))
    # a hold 5 s later: only volatile fields differ -> nothing written, but the next pass sees them
    clock.now = 5
    second = {"replicas": 2, "lag": 7, "lastDecision": {**HOLD, "time": "t2"}, "policy": {"w": [1, 2]}}
    assert mem.to_write("u", body(11, first), second) is None
    view = mem.view("u", body(11, first))
    assert view["lag"] == 7 and view["lastDecision"]["time"] == "t2" and view["policy"] == {"w": [1, 2]}
    # the heartbeat: written with everything pending
    clock.now = 61
    third = {"replicas": 2, "lag": 8, "lastDecision": {**HOLD, "time": "t3"}, "policy": {"w": [3]}}
    assert mem.to_write("u", body(11, first), third) == third


def test_a_significant_change_is_written_at_once() -> None:
    clock = Clock()
    mem = StatusMemory(heartbeat_s=60, clock=clock)
    first = {"replicas": 2, "lastDecision": {**HOLD, "time": "t1"}}
    mem.to_write("u", body(1, {}), first)
    mem.written("u", body(2, first))
    clock.now = 1
    scaled = {"replicas": 2, "lastDecision": {**HOLD, "factor": 8, "time": "t2"}}
    assert mem.to_write("u", body(2, first), scaled) == scaled


def test_the_last_write_wins_over_a_watch_that_has_not_delivered_it() -> None:
    mem = StatusMemory(heartbeat_s=60, clock=Clock())
    written = {"assignment": {"generation": 7}}
    mem.to_write("u", body(1, {}), written)
    mem.written("u", body(5, written))
    assert mem.view("u", body(4, {"assignment": {"generation": 6}}))["assignment"] == {"generation": 7}
    assert mem.view("u", body(6, {"assignment": {"generation": 8}}))["assignment"] == {"generation": 8}


def test_significant_ignores_volatile_fields_and_transition_times() -> None:
    a = {"lag": 1, "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "x"}]}
    b = {"lag": 2, "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "y"}]}
    assert significant(a) == significant(b)
    c = {"lag": 2, "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": "y"}]}
    assert significant(a) != significant(c)


def test_a_null_is_an_absent_field() -> None:
    assert significant({"assignment": {"generation": 1, "pending": None}}) == significant(
        {"assignment": {"generation": 1}}
    )
