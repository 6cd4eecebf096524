"""A parameter sweep over traces and policy parameters.

:func:`sweep_grid` and :func:`run_case` are pure; :func:`run_sweep` runs the cases as a PySpark job
(``mapPartitions`` over the grid) and writes Parquet, so it does I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

__all__ = ["SWEEP_SCHEMA", "run_case", "run_sweep", "summarise", "sweep_grid"]

# (policy, overrides) variants swept by default: the lane-equipped baselines' main knobs (KEDA's
# lagThreshold, the fixed factor, Flink's own slower timings), the references, multilane's targets and
# the partition-capped baselines.
DEFAULT_VARIANTS: Sequence[tuple[str, dict[str, Any]]] = (
    ("multilane", {}),
    ("multilane", {"target_utilisation": 0.85}),
    ("multilane", {"factor": 4}),
    ("keda-hpa", {}),
    ("keda-hpa", {"lag_threshold": 100.0}),
    ("keda-hpa", {"lag_threshold": 1000.0}),
    ("keda-hpa", {"factor": 4}),
    ("keda-hpa", {"factor": 64}),
    ("keda-hpa", {"use_cached_metrics": True}),
    ("flink-on-lanes", {}),
    ("flink-style", {}),
    (
        "flink-style",
        {
            "catchup_s": 1800.0,
            "stabilisation_s": 300.0,
            "metrics_window_s": 900.0,
            "scale_down_delay_s": 3600.0,
        },
    ),
    ("factor-only", {}),
    ("static", {}),
    ("keda-hpa-serial", {}),
    ("flink-style-serial", {}),
)

SWEEP_SCHEMA = (
    "trace string, policy string, variant string, seed int, sim string, lag_seconds double, "
    "peak_lag double, time_to_drain_s double, drained boolean, scaling_actions int, partition_moves int, "
    "replica_changes int, factor_changes int, reaction_s double, recovery_s double, recovered boolean, "
    "time_above_slo_s double, pod_seconds double, lane_seconds double, call_seconds double, "
    "final_lag double, produced double, processed double"
)


def sweep_grid(
    traces: Sequence[str],
    seeds: Sequence[int],
    duration_s: int | None,
    variants: Sequence[tuple[str, dict[str, Any]]] = DEFAULT_VARIANTS,
    sim_overrides: Sequence[dict[str, Any]] = ({},),
) -> list[dict[str, Any]]:
    """Every (trace, variant, seed, simulation override) combination, as JSON-friendly dicts."""
    return [
        {
            "trace": t,
            "policy": name,
            "variant": json.dumps(over, sort_keys=True),
            "seed": s,
            "sim": json.dumps(sim, sort_keys=True),
            "duration_s": duration_s,
        }
        for t in traces
        for name, over in variants
        for s in seeds
        for sim in sim_overrides
    ]


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    """Simulate one grid entry; returns its metrics row (matching :data:`SWEEP_SCHEMA`). A variant's
    ``factor`` is the fixed factor (keda-hpa, flink-style) or multilane's ``min_factor`` and start."""
    from multilane.sim.engine import DEFAULT_FIXED_FACTOR, make_policy, simulate
    from multilane.sim.model import SimConfig
    from multilane.sim.traces import make_trace

    sim = replace(SimConfig(), **json.loads(case["sim"]))
    duration = case.get("duration_s")
    trace = make_trace(
        case["trace"], None if duration is None else int(duration), sim.partitions, int(case["seed"])
    )
    over = json.loads(case["variant"])
    factor = (
        int(over.pop("factor", DEFAULT_FIXED_FACTOR)) if case["policy"] != "static" else DEFAULT_FIXED_FACTOR
    )
    if case["policy"] in ("multilane", "factor-only", "static"):
        sim = replace(sim, initial_factor=factor)
    policy = make_policy(case["policy"], sim, over, trace=trace, factor=factor)
    m = simulate(trace, policy, sim, int(case["seed"])).metrics.to_dict()
    return {
        "trace": case["trace"],
        "policy": case["policy"],
        "variant": case["variant"],
        "seed": int(case["seed"]),
        "sim": case["sim"],
        **{k: (float(v) if isinstance(v, float) else v) for k, v in m.items()},
    }


def _run_partition(cases: Iterable[Any]) -> Iterator[dict[str, Any]]:
    for c in cases:
        yield run_case(c.asDict() if hasattr(c, "asDict") else dict(c))


def summarise(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean metrics per (trace, policy, variant, sim) over seeds, sorted by trace then lag-seconds."""
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["trace"], r["policy"], r["variant"], r["sim"]), []).append(r)
    out = []
    for (trace, policy, variant, sim), rs in groups.items():
        n = len(rs)
        out.append(
            {
                "trace": trace,
                "policy": policy,
                "variant": variant,
                "sim": sim,
                "runs": n,
                "lag_seconds": sum(r["lag_seconds"] for r in rs) / n,
                "pod_seconds": sum(r["pod_seconds"] for r in rs) / n,
                "scaling_actions": sum(r["scaling_actions"] for r in rs) / n,
                "time_above_slo_s": sum(r["time_above_slo_s"] for r in rs) / n,
                "drained": (
                    None if all(r["drained"] is None for r in rs) else sum(1 for r in rs if r["drained"]) / n
                ),
            }
        )
    out.sort(key=lambda r: (r["trace"], r["lag_seconds"]))
    return out


def run_sweep(
    cases: Sequence[dict[str, Any]], out_path: str, master: str = "local[*]"
) -> list[dict[str, Any]]:
    """Run ``cases`` on Spark, write the metric rows as Parquet to ``out_path``, return the rows."""
    # the pipeline's session: a local master runs the Python workers with this interpreter (not
    # whichever `python3` is first on PATH, which may lack numpy)
    from multilane.pipeline.job import spark_session

    spark = spark_session(master, "multilane-simulate-sweep", conf={"spark.sql.shuffle.partitions": "4"})
    try:
        slices = max(1, min(len(cases), spark.sparkContext.defaultParallelism * 4))
        rdd = spark.sparkContext.parallelize(list(cases), slices).mapPartitions(_run_partition)
        df = spark.createDataFrame(rdd, schema=SWEEP_SCHEMA)
        df.write.mode("overwrite").parquet(out_path)
        rows = [r.asDict() for r in spark.read.parquet(out_path).collect()]
    finally:
        spark.stop()
    return rows
