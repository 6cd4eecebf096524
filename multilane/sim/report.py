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
    ("scaling_actions", "actions"),
    ("replica_changes", "R chg"),
    ("factor_changes", "F chg"),
)

POD_SECONDS_MARGIN = 1.05
"""The goal: multilane's lag-seconds <= a baseline's at <= 1.05 x its pod-seconds."""


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


GOAL_BASELINES = ("keda-hpa", "flink-style")
"""The lane-equipped autoscalers the goal is judged against; ``factor-only`` (one pod) and
``static`` (sized for the peak) are reference points, reported by :func:`references`."""


def verdicts(
    rows: Sequence[dict[str, Any]],
    policy: str = "multilane",
    margin: float = POD_SECONDS_MARGIN,
    against: Sequence[str] = GOAL_BASELINES,
) -> list[str]:
    """Per trace: are ``policy``'s lag-seconds <= each of ``against``'s (lane-equipped policies), at
    <= ``margin`` x its pod-seconds and with no more scaling actions? One line per trace, naming each
    condition that fails."""
    out: list[str] = []
    fair, _capped = split_rows(rows)
    for trace in dict.fromkeys(r["trace"] for r in fair):
        mine = next((r for r in fair if r["trace"] == trace and r["policy"] == policy), None)
        if mine is None:
            continue
        others = [r for r in fair if r["trace"] == trace and r["policy"] in against and r["policy"] != policy]
        if not others:
            out.append(f"{trace}: no other policy to compare with")
            continue
        failures: list[str] = []
        for other in others:
            name = other["policy"]
            if mine["lag_seconds"] > other["lag_seconds"] + 1e-9:
                failures.append(f"lag-seconds above {name}")
            if mine["pod_seconds"] > margin * other["pod_seconds"]:
                failures.append(f"pod-seconds above {margin:g} x {name}")
            if mine["scaling_actions"] > other["scaling_actions"]:
                failures.append(f"more scaling actions than {name}")
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
