"""``multilane simulate``: compare autoscaling policies on simulated traces.

Does I/O: reads a CSV trace, prints tables, writes PNG plots, JSON and (``--sweep``) Parquet.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace",
        default="all",
        help="step | surge | diurnal | bursts | hot_key | slowdown | all | a CSV file of timestamp_s,rate "
        "(default: all)",
    )
    parser.add_argument("--duration", type=int, default=3600, help="simulated seconds (default 3600)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument(
        "--policies",
        default="multilane,keda-hpa,flink-style",
        help="comma-separated policy names: multilane, keda-hpa, flink-style, static (never scales)",
    )
    parser.add_argument("--out", type=Path, default=None, help="directory for PNG plots (and sweep output)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a SimConfig field, e.g. --set downstream_concurrency=32 (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="print the metrics as JSON instead of a table")
    parser.add_argument("--sweep", action="store_true", help="run the parameter sweep on Spark")
    parser.add_argument("--seeds", type=int, default=3, help="sweep: seeds per case (default 3)")
    parser.add_argument("--master", default="local[*]", help="sweep: Spark master (default local[*])")


def _traces(arg: str, duration: int, partitions: int, seed: int) -> list[Any]:
    from multilane.sim.traces import TRACE_NAMES, make_trace, parse_csv_trace

    if arg == "all":
        return [make_trace(n, duration, partitions, seed) for n in TRACE_NAMES]
    if arg in TRACE_NAMES:
        return [make_trace(arg, duration, partitions, seed)]
    path = Path(arg)
    if not path.is_file():
        raise ValueError(f"--trace {arg!r} is neither a known trace ({', '.join(TRACE_NAMES)}) nor a file")
    return [parse_csv_trace(path.read_text(), duration, partitions, name=path.stem)]


def sim_config(settings: list[str]) -> Any:
    """A :class:`SimConfig` with ``FIELD=VALUE`` overrides (values parsed as JSON, else strings)."""
    from dataclasses import fields, replace

    from multilane.sim.model import SimConfig

    known = {f.name for f in fields(SimConfig)}
    overrides: dict[str, Any] = {}
    for item in settings:
        key, sep, raw = item.partition("=")
        if not sep or key not in known:
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE with FIELD in {', '.join(sorted(known))}")
        try:
            overrides[key] = json.loads(raw)
        except json.JSONDecodeError:
            overrides[key] = raw
    return replace(SimConfig(), **overrides)


def run(args: argparse.Namespace) -> int:
    from multilane.sim.engine import make_policy, simulate
    from multilane.sim.report import comparison_rows, comparison_table, verdicts

    console = Console(width=None if sys.stdout.isatty() else 132)
    try:
        sim = sim_config(args.set)
    except ValueError as exc:
        print(f"multilane simulate: {exc}", file=sys.stderr)
        return 2
    if args.sweep:
        return _run_sweep(args, console, sim)
    try:
        traces = _traces(args.trace, args.duration, sim.partitions, args.seed)
        policies = [make_policy(n.strip(), sim) for n in args.policies.split(",") if n.strip()]
    except ValueError as exc:
        print(f"multilane simulate: {exc}", file=sys.stderr)
        return 2
    all_results = []
    for trace in traces:
        results = [simulate(trace, p, sim, args.seed) for p in policies]
        all_results.extend(results)
        if args.out is not None:
            from multilane.sim.plots import plot_trace

            plot_trace(results, args.out)
    rows = comparison_rows(all_results)
    if args.json:
        print(json.dumps({"seed": args.seed, "duration_s": args.duration, "rows": rows}, indent=2))
        return 0
    console.print(comparison_table(rows, f"policy comparison ({args.duration} s, seed {args.seed})"))
    for line in verdicts(rows):
        console.print(f"multilane vs baselines: {line}")
    for r in all_results:
        for t, w in r.warnings:
            console.print(f"[dim]{r.trace}/{r.policy} t={t:.0f}s: {w}[/dim]")
    if args.out is not None:
        console.print(f"plots written to {args.out}/")
    return 0


def _label(overrides_json: str) -> str:
    """``{"a": 1, "b": 2}`` -> ``a=1 b=2``; ``{}`` -> ``defaults``."""
    items = json.loads(overrides_json)
    return (
        " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in items.items()) or "defaults"
    )


def _run_sweep(args: argparse.Namespace, console: Console, sim: Any) -> int:
    from rich.table import Table

    from multilane.sim.sweep import run_sweep, summarise, sweep_grid
    from multilane.sim.traces import TRACE_NAMES

    out = args.out or Path("sim-sweep")
    traces = list(TRACE_NAMES) if args.trace == "all" else [args.trace]
    base = {k: v for k, v in vars(sim).items() if v != getattr(type(sim)(), k)}
    sims = [base, {**base, "baseline_lanes_per_pod": sim.partitions}]
    cases = sweep_grid(
        traces, list(range(args.seed, args.seed + args.seeds)), args.duration, sim_overrides=sims
    )
    rows = run_sweep(cases, str(out / "runs.parquet"), master=args.master)
    summary = summarise(rows)
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    table = Table(title=f"sweep: {len(rows)} runs, mean over {args.seeds} seeds")
    for h in ("trace", "policy", "variant", "simulation", "lag-seconds", "pod-seconds", "actions", "drained"):
        table.add_column(h, justify="left" if h in ("trace", "policy", "variant", "simulation") else "right")
    for s in summary:
        table.add_row(
            s["trace"],
            s["policy"],
            _label(s["variant"]),
            _label(s["sim"]),
            f"{s['lag_seconds']:,.0f}",
            f"{s['pod_seconds']:,.0f}",
            f"{s['scaling_actions']:.1f}",
            "-" if s["drained"] is None else f"{s['drained']:.0%}",
        )
    console.print(table)
    console.print(f"runs written to {out / 'runs.parquet'}")
    return 0
