"""The one rendering of a control-loop pass's status (``multilane.operator.pass_model.render_status``):
which keys a pass writes, and the conditions set over those read."""

from __future__ import annotations

from multilane.operator.pass_model import (
    ConditionValue,
    ConsumerStatus,
    DecisionStatus,
    SampleStatus,
    render_status,
)
from multilane.operator.rollout.assignment import AssignmentState

STAMP = "2026-11-27T01:00:00Z"
CONDITIONS = (
    ConditionValue("Scaling", False, "Stable", "2 workers"),
    ConditionValue("Rebalancing", False, "Assigned", "generation 3"),
    ConditionValue("Degraded", False, "AsExpected", ""),
    ConditionValue("Ready", True, "AllPartitionsAssigned", "4 partitions on 2 workers, factor 2"),
)


def _status(**kw: object) -> ConsumerStatus:
    assignment = AssignmentState(generation=3, members={"w-0": ("t/0", "t/1"), "w-1": ("t/2", "t/3")})
    return ConsumerStatus(replicas=2, factor=2, assignment=assignment, conditions=CONDITIONS, **kw)  # type: ignore[arg-type]


def test_a_pass_without_sample_decision_or_handoff_writes_only_the_size_conditions_and_assignment() -> None:
    out = render_status(_status(), [], STAMP)
    assert list(out) == ["replicas", "factor", "conditions", "assignment"]
    assert out["assignment"]["generation"] == 3
    assert {c["type"]: (c["status"], c["reason"]) for c in out["conditions"]} == {
        "Scaling": ("False", "Stable"),
        "Rebalancing": ("False", "Assigned"),
        "Degraded": ("False", "AsExpected"),
        "Ready": ("True", "AllPartitionsAssigned"),
    }


def test_sample_decision_and_rollout_keys_in_the_order_a_pass_wrote_them() -> None:
    decision = DecisionStatus(STAMP, 3, 4, "scale-up", "lag", {"totalLag": 10}, ("w",))
    out = render_status(
        _status(sample=SampleStatus(10, 1.23456, None), last_decision=decision, handoff=True),
        [],
        STAMP,
    )
    assert list(out)[:4] == ["lag", "inputRate", "lastDecision", "rollout"]
    assert out["lag"] == 10 and out["inputRate"] == 1.235 and "processingRate" not in out
    assert out["lastDecision"] == {
        "time": STAMP,
        "replicas": 3,
        "factor": 4,
        "rule": "scale-up",
        "reason": "lag",
        "inputs": {"totalLag": 10},
        "warnings": ["w"],
    }
    assert out["rollout"] is None  # a handoff executor runs, no rollout: written as null


def test_conditions_are_set_over_those_read_keeping_the_others_and_unchanged_times() -> None:
    previous = [
        {"type": "Paused", "status": "False", "reason": "NotPaused", "message": "",
         "lastTransitionTime": "x"},
        {"type": "Ready", "status": "True", "reason": "AllPartitionsAssigned", "message": "old",
         "lastTransitionTime": "then"},
    ]  # fmt: skip
    out = render_status(_status(), previous, STAMP)
    by_type = {c["type"]: c for c in out["conditions"]}
    assert set(by_type) == {"Paused", "Scaling", "Rebalancing", "Degraded", "Ready"}
    assert by_type["Ready"]["lastTransitionTime"] == "then"  # status did not change
    assert by_type["Ready"]["message"] == "4 partitions on 2 workers, factor 2"
    assert by_type["Scaling"]["lastTransitionTime"] == STAMP
