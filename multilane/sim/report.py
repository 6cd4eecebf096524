"""Comparison rows and tables of simulated runs. Pure: no I/O (rendering returns objects/strings)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich.table import Table

from multilane.sim.engine import SimResult

__all__ = ["COLUMNS", "comparison_rows", "comparison_table", "verdicts"]

COLUMNS: Sequence[tuple[str, str]] = (
    ("trace", "trace"),
    ("policy", "policy"),
    ("lag_seconds", "lag-seconds"),
    ("peak_lag", "peak lag"),
    ("time_to_drain_s", "drain s"),
    ("scaling_actions", "actions"),
    ("partition_moves", "moves"),
    ("pod_seconds", "pod-seconds"),
    ("final_lag", "final lag"),
)


def comparison_rows(results: Iterable[SimResult]) -> list[dict[str, Any]]:
    """One flat dict per run: trace, policy and the metrics."""
    return [
        {"trace": r.trace, "policy": r.policy, "event_time_s": r.event_time_s, **r.metrics.to_dict()}
        for r in results
    ]


def _fmt(key: str, value: Any, row: dict[str, Any]) -> str:
    if key == "time_to_drain_s":
        if value is None:
            return "-" if row.get("event_time_s") is None else "never"
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


def verdicts(rows: Sequence[dict[str, Any]], policy: str = "multilane") -> list[str]:
    """Per trace: does ``policy`` beat every other policy on lag-seconds with no more pod-seconds
    and no more scaling actions? One line per trace, saying which condition fails if any."""
    out: list[str] = []
    for trace in dict.fromkeys(r["trace"] for r in rows):
        mine = next((r for r in rows if r["trace"] == trace and r["policy"] == policy), None)
        if mine is None:
            continue
        failures: list[str] = []
        others = [r for r in rows if r["trace"] == trace and r["policy"] != policy]
        if not others:
            out.append(f"{trace}: no other policy to compare with")
            continue
        for other in others:
            name = other["policy"]
            if mine["lag_seconds"] >= other["lag_seconds"]:
                failures.append(f"lag-seconds not below {name}")
            if mine["pod_seconds"] > other["pod_seconds"]:
                failures.append(f"more pod-seconds than {name}")
            if mine["scaling_actions"] > other["scaling_actions"]:
                failures.append(f"more scaling actions than {name}")
        out.append(f"{trace}: " + ("wins on all three" if not failures else "; ".join(failures)))
    return out
