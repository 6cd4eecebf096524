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

from multilane.extras import MissingExtraError, require
from multilane.progress_bar import ProgressBar

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace",
        default="all",
        help="a trace name (step, surge, diurnal, bursts, hot_key, slowdown, flash_diurnal, batch_dumps, "
        "ramp, slow_episode, square_wave, saturated_ramp, crowd, uneven_partitions), all, or a CSV file "
        "of t_seconds,records_per_second[,service_factor[,event]] rows (examples/trace-flash-crowd.csv; "
        "default: all)",
    )
    parser.add_argument(
        "--duration",
        type=int,
        default=None,
        help="simulated seconds (default: each trace's own, 1-2.5 h; a CSV: its last row + 600 s; "
        "a duration that would cut a CSV's rows is refused)",
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument(
        "--policies",
        default="fair",
        help="fair (multilane, keda-hpa, flink-on-lanes, flink-style, factor-only, static: all on multilane "
        "workers), "
        "capped (the partition-capped keda-hpa-serial, flink-style-serial), all, or comma-separated names "
        "(default: fair)",
    )
    parser.add_argument(
        "--factor",
        type=int,
        default=16,
        help="the fixed factor of keda-hpa, flink-on-lanes and flink-style (default 16)",
    )
    parser.add_argument(
        "--slo-lag",
        type=float,
        default=None,
        help="lag (records) for the time-above-SLO column (default 1000)",
    )
    parser.add_argument("--warnings", action="store_true", help="list the policies' warnings")
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


def _traces(arg: str, duration: int | None, partitions: int, seed: int) -> list[Any]:
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


def policy_names(arg: str) -> list[str]:
    """``fair`` / ``capped`` / ``all`` or a comma-separated list -> policy names."""
    from multilane.sim.engine import CAPPED_POLICIES, FAIR_POLICIES, POLICY_NAMES

    groups = {"fair": list(FAIR_POLICIES), "capped": list(CAPPED_POLICIES), "all": list(POLICY_NAMES)}
    if arg in groups:
        return groups[arg]
    names = [n.strip() for n in arg.split(",") if n.strip()]
    unknown = [n for n in names if n not in POLICY_NAMES]
    if unknown or not names:
        raise ValueError(f"unknown policy {', '.join(unknown) or arg!r}; known: {', '.join(POLICY_NAMES)}")
    return names


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from multilane.sim.engine import SimResult, make_policy, simulate
    from multilane.sim.report import (
        capacity_notes,
        comparison_rows,
        comparison_table,
        references,
        split_rows,
        verdicts,
    )

    console = Console(width=None if sys.stdout.isatty() else 200)
    try:
        sim = sim_config(args.set)
        if args.slo_lag is not None:
            sim = replace(sim, slo_lag=args.slo_lag)
        names = policy_names(args.policies)
        if args.factor < 1:
            raise ValueError("--factor must be >= 1")
    except ValueError as exc:
        print(f"multilane simulate: {exc}", file=sys.stderr)
        return 2
    try:
        if args.sweep:
            require("pipeline", for_what="multilane simulate --sweep")
        elif args.out is not None:
            require("plot", for_what="multilane simulate --out")
    except MissingExtraError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.sweep:
        return _run_sweep(args, console, sim)
    try:
        traces = _traces(args.trace, args.duration, sim.partitions, args.seed)
    except ValueError as exc:
        print(f"multilane simulate: {exc}", file=sys.stderr)
        return 2
    all_results: list[SimResult] = []
    with ProgressBar("simulating", total=len(traces) * len(names)) as bar:
        for trace in traces:
            results: list[SimResult] = []
            for name in names:
                scaling = make_policy(name, sim, trace=trace, factor=args.factor)
                results.append(simulate(trace, scaling, sim, args.seed))
                bar.update(len(all_results) + len(results))  # runs done so far
            all_results.extend(results)
            if args.out is not None:
                from multilane.sim.plots import plot_trace

                plot_trace(results, args.out)
    rows = comparison_rows(all_results)
    if args.json:
        print(json.dumps({"seed": args.seed, "duration_s": args.duration, "rows": rows}, indent=2))
        return 0
    fair, capped = split_rows(rows)
    head = f"seed {args.seed}, SLO lag {sim.slo_lag:,.0f}"
    if fair:
        console.print(
            comparison_table(
                fair,
                f"fair comparison: every group runs multilane workers (F={args.factor} "
                f"for the fixed-factor baselines; {head})",
            )
        )
        for line in verdicts(rows):
            console.print(f"goal (multilane vs keda-hpa, flink-on-lanes, flink-style, static): {line}")
        for line in references(rows):
            console.print(f"reference: {line}")
    if capped:
        console.print(
            comparison_table(
                capped, f"partition-capped baselines: one record at a time per partition ({head})"
            )
        )
    for note in capacity_notes(traces, sim):
        console.print(f"capacity: {note}")
    from multilane.sim.engine import warning_template

    warnings = [
        (r.trace, r.policy, t, w, r.warning_counts.get(warning_template(w), 1))
        for r in all_results
        for t, w in r.warnings
    ]
    if args.warnings:
        for trace_name, policy, t, w, count in warnings:
            console.print(f"[dim]{trace_name}/{policy} t={t:.0f}s ({count}x): {w}[/dim]")
    elif warnings:
        console.print(
            f"[dim]{len(warnings)} kinds of policy warning (grouped by template; --warnings lists them)[/dim]"
        )
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
    # the measured platform; a Kubernetes-like pod start; 100 MB of state per partition to restore
    sims = [base, {**base, "pod_start_s": 30.0}, {**base, "state_mb_per_partition": 100.0}]
    cases = sweep_grid(
        traces, list(range(args.seed, args.seed + args.seeds)), args.duration, sim_overrides=sims
    )
    rows = run_sweep(cases, str(out / "runs.parquet"), master=args.master)
    summary = summarise(rows)
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    table = Table(title=f"sweep: {len(rows)} runs, mean over {args.seeds} seeds")
    for h in ("trace", "policy", "variant", "simulation", "lag-seconds", "pod-seconds", "actions", "s > SLO"):
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
            f"{s['time_above_slo_s']:,.0f}",
        )
    console.print(table)
    console.print(f"runs written to {out / 'runs.parquet'}")
    return 0
