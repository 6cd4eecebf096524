"""The words of a scaling decision: the one-line summary of what the capacity model found, and the
note on a factor held back until new pods are ready. Pure: no I/O; plain values in, text out (it
imports no other part of the policy). The rules themselves are named in
:data:`multilane.operator.decision.policy_model.RULES`."""

from __future__ import annotations

__all__ = ["pods_note", "summary"]


def summary(
    needed_rate: float,
    lanes_needed: int,
    lane_rate: float,
    lane_rate_source: str,
    backlog: int,
    capped_by_bottleneck: str | None,
) -> str:
    """``need N rec/s = L lanes at r rec/s/lane (source); backlog B`` (plus the bottleneck's cap)."""
    text = (
        f"need {needed_rate:.1f} rec/s = {lanes_needed} lanes at "
        f"{round(lane_rate, 3)} rec/s/lane ({lane_rate_source}); backlog {backlog}"
    )
    if capped_by_bottleneck is not None:
        text += (
            f"; capped at {capped_by_bottleneck}: the last scale-up did not raise the "
            "processing rate (bottleneck)"
        )
    return text


def pods_note(ready: int, replicas: int, factor: int, recommended_factor: int) -> str:
    """The note on a factor held below the recommendation until the new pods are ready (or "")."""
    if factor < recommended_factor and replicas > ready:
        return f"; factor {factor} until the new pods are ready ({ready} of {replicas}), then " + str(
            recommended_factor
        )
    return ""
