"""The words of a scaling decision: the one-line summary of what the capacity model found, and the
note on a factor held back until new pods are ready. Pure: no I/O. The rules themselves are named in
:data:`multilane.operator.policy_model.RULES`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from multilane.operator.decision.capacity import Recommendation

if TYPE_CHECKING:
    from multilane.operator.decision.damping import DampingContext

__all__ = ["pods_note", "summary"]


def summary(rec: Recommendation, inputs: Mapping[str, Any]) -> str:
    summary = (
        f"need {rec.needed_rate:.1f} rec/s = {rec.lanes_needed} lanes at "
        f"{inputs['lane_rate']} rec/s/lane ({inputs['lane_rate_source']}); backlog {inputs['backlog']}"
    )
    if "capped_by_bottleneck" in inputs:
        summary += (
            f"; capped at {inputs['capped_by_bottleneck']}: the last scale-up did not raise the "
            "processing rate (bottleneck)"
        )
    return summary


def pods_note(c: DampingContext, replicas: int, factor: int, rec: Recommendation) -> str:
    if factor < rec.factor and replicas > c.ready:
        return f"; factor {factor} until the new pods are ready ({c.ready} of {replicas}), then {rec.factor}"
    return ""
