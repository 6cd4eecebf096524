"""Comparison rows and tables of simulated runs. Pure: no I/O (rendering returns objects/strings)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich.table import Table

from multilane.sim.engine import CAPPED_POLICIES, SimResult
from multilane.sim.model import SimConfig
from multilane.sim.traces import Trace

__all__ = [
    "COLUMNS",
    "GOAL_BASELINES",
    "GOAL_RIVALS",
    "POD_SECONDS_MARGIN",
    "capacity_notes",
    "comparison_rows",
    "comparison_table",
    "references",
    "split_rows",
    "verdicts",
]

COLUMNS: Sequence[tuple[str, str]] = (
    ("trace", "trace"),
    ("policy", "policy"),
    ("lag_seconds", "lag-seconds"),
    ("peak_lag", "peak lag"),
    ("reaction_s", "react s"),
    ("recovery_s", "recover s"),
    ("time_above_slo_s", "s > SLO"),
    ("pod_seconds", "pod-seconds"),
    ("lane_seconds", "lane-s"),
    ("call_seconds", "call-s"),
    ("scaling_actions", "actions"),
    ("replica_changes", "R chg"),
    ("factor_changes", "F chg"),
)

POD_SECONDS_MARGIN = 1.05
"""The goal: multilane's pod-seconds <= 1.05 x those of the rival with the lowest lag."""


def comparison_rows(results: Iterable[SimResult]) -> list[dict[str, Any]]:
    """One flat dict per run: trace, policy and the metrics."""
    return [
        {"trace": r.trace, "policy": r.policy, "event_time_s": r.event_time_s, **r.metrics.to_dict()}
        for r in results
    ]


def split_rows(rows: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(lane-equipped rows, partition-capped rows)."""
    fair = [r for r in rows if r["policy"] not in CAPPED_POLICIES]
    return fair, [r for r in rows if r["policy"] in CAPPED_POLICIES]


def _fmt(key: str, value: Any, row: dict[str, Any]) -> str:
    if key == "reaction_s":
        return "-" if value is None else f"{value:.0f}"
    if key == "recovery_s":
        if value is None:
            return "never" if row.get("recovered") is False else "-"
        return f"{value:.0f}"
    if isinstance(value, float):
        return f"{value:,.0f}"
    return str(value)


def comparison_table(rows: Sequence[dict[str, Any]], title: str = "policy comparison") -> Table:
    table = Table(title=title)
    for key, header in COLUMNS:
        table.add_column(header, justify="left" if key in ("trace", "policy") else "right")
    for row in rows:
        table.add_row(*(_fmt(k, row[k], row) for k, _ in COLUMNS))
    return table


GOAL_BASELINES = ("keda-hpa", "flink-on-lanes", "flink-style")
"""The scaling rivals (all on multilane workers) the goal is judged against."""
GOAL_RIVALS = (*GOAL_BASELINES, "static")
"""Every fair rival: the scaling ones plus ``static`` (sized for the peak, known in advance), which
counts for the pod-seconds condition. ``factor-only`` (one pod) is a reference point only."""


def verdicts(
    rows: Sequence[dict[str, Any]],
    policy: str = "multilane",
    margin: float = POD_SECONDS_MARGIN,
    against: Sequence[str] = GOAL_BASELINES,
    rivals: Sequence[str] = GOAL_RIVALS,
) -> list[str]:
    """Per trace, the goal against the fair rivals, one line naming each condition that fails:

    1. ``policy``'s lag-seconds <= every scaling rival's (``against``);
    2. its seconds above the SLO <= every scaling rival's;
    3. its pod-seconds <= ``margin`` x those of the rival (of ``rivals``) with the lowest lag (on a
       tie, the one of them with the fewest pod-seconds: the strictest reading);
    4. no more scaling actions than any scaling rival.
    """
    out: list[str] = []
    fair, _capped = split_rows(rows)
    for trace in dict.fromkeys(r["trace"] for r in fair):
        mine = next((r for r in fair if r["trace"] == trace and r["policy"] == policy), None)
        if mine is None:
            continue
        scaling = [
            r for r in fair if r["trace"] == trace and r["policy"] in against and r["policy"] != policy
        ]
        others = [r for r in fair if r["trace"] == trace and r["policy"] in rivals and r["policy"] != policy]
        if not others:
            out.append(f"{trace}: no other policy to compare with")
            continue
        failures: list[str] = []
        for other in scaling:
            name = other["policy"]
            # 1.
            if mine["lag_seconds"] > other["lag_seconds"] * (1 + 1e-9) + 1e-6:  # float sums differ
                failures.append(f"lag-seconds above {name}")
            # 2.
            if mine["time_above_slo_s"] > other["time_above_slo_s"]:
                failures.append(f"s > SLO above {name}")
            # 4.
            if mine["scaling_actions"] > other["scaling_actions"]:
                failures.append(f"more scaling actions than {name}")
        # 3.
        best = min(others, key=lambda r: (r["lag_seconds"], r["pod_seconds"]))
        if mine["pod_seconds"] > margin * best["pod_seconds"]:
            failures.append(f"pod-seconds above {margin:g} x {best['policy']} (the lowest lag)")
        out.append(f"{trace}: " + ("meets the goal" if not failures else "; ".join(failures)))
    return out


def references(
    rows: Sequence[dict[str, Any]], policy: str = "multilane", refs: Sequence[str] = ("factor-only", "static")
) -> list[str]:
    """Per trace, ``policy`` against the reference rows: lag-seconds and pod-seconds side by side."""
    out: list[str] = []
    for trace in dict.fromkeys(r["trace"] for r in rows):
        mine = next((r for r in rows if r["trace"] == trace and r["policy"] == policy), None)
        if mine is None:
            continue
        parts = []
        for ref in refs:
            other = next((r for r in rows if r["trace"] == trace and r["policy"] == ref), None)
            if other is not None:
                parts.append(f"{ref} {other['lag_seconds']:,.0f} lag-s / {other['pod_seconds']:,.0f} pod-s")
        if parts:
            out.append(
                f"{trace}: {policy} {mine['lag_seconds']:,.0f} lag-s / {mine['pod_seconds']:,.0f} pod-s; "
                + "; ".join(parts)
            )
    return out


def capacity_notes(traces: Sequence[Trace], sim: SimConfig, max_factor: int = 64) -> list[str]:
    """One line per trace whose worst second needs more than the simulated maximum capacity."""
    capacity, limit = sim.max_capacity(max_factor)
    notes = []
    for t in traces:
        if t.peak_demand > capacity:
            seconds = int((t.rate * t.service_factor > capacity).sum())
            notes.append(
                f"{t.name}: peak demand {t.peak_demand:,.0f} rec/s exceeds the simulated maximum capacity "
                f"{capacity:,.0f} rec/s ({limit}) for {seconds} s: every policy falls behind there"
            )
    return notes
