"""Status conditions of a ParallelConsumer. Pure: no I/O.

Condition types: ``Ready``, ``Scaling``, ``Rebalancing``, ``Degraded``, ``Paused``. Each carries
``status`` ("True"/"False"/"Unknown"), ``reason`` (CamelCase), ``message`` and ``lastTransitionTime``,
which changes only when ``status`` changes (the Kubernetes API conventions).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["CONDITION_TYPES", "condition", "now_iso", "set_condition"]

CONDITION_TYPES = ("Ready", "Scaling", "Rebalancing", "Degraded", "Paused")


def now_iso(now: dt.datetime | None = None) -> str:
    return (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    for c in conditions or []:
        if c.get("type") == type_:
            return c
    return None


def set_condition(
    conditions: Sequence[Mapping[str, Any]] | None,
    type_: str,
    status: bool | None,
    reason: str,
    message: str,
    *,
    now: str | None = None,
    observed_generation: int | None = None,
) -> list[dict[str, Any]]:
    """A new conditions list with ``type_`` set; ``status`` None means "Unknown"."""
    if type_ not in CONDITION_TYPES:
        raise ValueError(f"unknown condition type {type_!r}")
    text = "Unknown" if status is None else ("True" if status else "False")
    out: list[dict[str, Any]] = []
    found = False
    for c in conditions or []:
        if c.get("type") != type_:
            out.append(dict(c))
            continue
        found = True
        changed = c.get("status") != text
        entry = {
            "type": type_,
            "status": text,
            "reason": reason,
            "message": message,
            "lastTransitionTime": (now or now_iso())
            if changed
            else c.get("lastTransitionTime", now or now_iso()),
        }
        if observed_generation is not None:
            entry["observedGeneration"] = observed_generation
        out.append(entry)
    if not found:
        entry = {
            "type": type_,
            "status": text,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now or now_iso(),
        }
        if observed_generation is not None:
            entry["observedGeneration"] = observed_generation
        out.append(entry)
    order = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return sorted(out, key=lambda c: order.get(str(c.get("type")), len(order)))
