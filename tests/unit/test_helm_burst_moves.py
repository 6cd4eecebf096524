"""The real-cluster burst scenario reads each move's pause from the operator's ``HandedOff`` Event
(tests/cluster/helm_harness.py, ``moves``): its pattern holds the operator's message format."""

from __future__ import annotations

import pytest

from benchmarks.k8s_burst_real import ConsumerEvent, moves
from multilane.operator.rollout.handoff_model import HandoffRecord, handed_off_event


@pytest.mark.parametrize("eager", [False, True])
def test_moves_read_the_operators_handed_off_event(eager: bool) -> None:
    record = HandoffRecord("t-1/3", "orders-0", "orders-1", eager, 1.5, 0.2345, 42)
    _type, reason, message = handed_off_event(record)
    (move,) = moves([ConsumerEvent(7.0, reason, message), ConsumerEvent(8.0, "ScalingDecision", "x")])
    assert (move.partition, move.source, move.target, move.eager) == ("t-1/3", "orders-0", "orders-1", eager)
    assert move.pause_s == pytest.approx(0.2345, abs=1e-3) and move.at == 7.0


def test_an_unreadable_handed_off_event_fails() -> None:
    with pytest.raises(AssertionError, match="cannot read"):
        moves([ConsumerEvent(1.0, "HandedOff", "something else")])
