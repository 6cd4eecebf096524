"""Burst benchmark: how fast the control plane meets a 10x step burst, on real worker processes.

Does I/O: its own embedded broker, the local control plane with worker subprocesses (the operator's
``ConsumerController`` and ``HandoffExecutor``), the load generator in its own process, files under a
temp dir.

Per partition count P (4, 24, 64; ``--quick``: 4) and variant (steps in :func:`_scenario`):

1. A topic of P partitions; one worker at factor 2 runs ``multilane.demo.processors``' stateful,
   IO-bound processor (a per-key counter in RocksDB and ``--sleep-ms`` of async I/O per record).
2. The load generator (its own process) offers a lull, a 10x step burst and a lull.
3. The control plane ticks every 0.25 s and decides every 2 s, as in the demo, until the load
   ended and the backlog drained.
4. Figures from 1 s samples of the workers' status: reaction (onset -> first scale decision),
   recovery (onset -> processing >= 95 % of the burst's achieved input, held 3 s), peak lag,
   lag-seconds, scaling actions, rollout duration (first release -> last promotion of the moves after
   the onset), the longest per-move pause, and the delivery checkers on the processing log
   (at-least-once, per-key order, exclusive key) plus state = the per-key counts of what was
   produced.

Variants, in the same run:

- ``multilane``: the two-speed policy; up to 4 moves at once (the CR default); a release waits
  only for running records.
- ``before``: the policy and rollout before the burst-response change, as settings: a scale-up
  applies the whole factor at once (``factor_first=False``); it needs 10 s of input of rising lag;
  a pending scale-up holds every later one until it settled (``shortfall_margin=inf``); no
  scale-down tolerance; one move at a time; a release waits for every fetched record
  (``--release-drain queued``).
- ``keda-hpa``: replicas only, at a fixed factor, as KEDA's Kafka scaler under the HPA would drive
  the same platform: desired = ceil(total lag / lagThreshold), 15 s sync and polling, 10 %
  tolerance, scale-up at most max(+100 %, +4 pods) per 15 s, 300 s scale-down window.
- ``operator`` (not in the default ``--variants``; ``--variants multilane,operator`` prints it beside
  the local plane's row): the ``multilane`` row through the Kubernetes path -- the real kopf operator
  (a timer every ``--operator-tick`` s) against the emulated API server, a real ``multilane worker``
  per pod of the StatefulSet it renders, each renewing its own Lease, and the operator's production
  metric source (committed and end offsets); :mod:`benchmarks.k8s_burst` says what is
  emulated and what differs. Figures are measured the same way.

Goals (ratios and figures of this run): recovery <= 10 s on 4 and 24 partitions; peak lag of
``multilane`` <= 1/4 of ``before`` with no more scale-ups; a 12-move rollout <= 8 s; the
longest per-move pause <= 0.5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks._common import Column, Report, log, main, ratio
from benchmarks._data import add_broker_argument, broker_passes, broker_session

if TYPE_CHECKING:
    from multilane.testing.loadgen import LoadResult

VARIANTS = ("multilane", "before", "keda-hpa", "operator")
DEFAULT_VARIANTS = ("multilane", "before", "keda-hpa")
CRD_PATH = Path(__file__).resolve().parents[1] / "crds" / "parallelconsumers.multilane.dev.yaml"
# lull, burst (rec/s, total): what two cores carry with the stateful processor (a RocksDB write and a
# changelog record per record) beside the broker, the workers and the load generator
RATES = {4: (150.0, 1500.0), 24: (150.0, 1500.0), 64: (200.0, 2000.0)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--partitions", default="", help="comma-separated partition counts (default 4,24,64)")
    parser.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help=f"comma-separated variants, of {','.join(VARIANTS)} (default {','.join(DEFAULT_VARIANTS)})",
    )
    parser.add_argument(
        "--operator-tick", type=float, default=0.25, help="the operator variant's control-loop period (s)"
    )
    parser.add_argument("--sleep-ms", type=float, default=50.0, help="simulated remote I/O per record")
    parser.add_argument("--burst-s", type=float, default=0.0, help="burst length (default 30 s, quick 15 s)")
    add_broker_argument(parser)
    parser.add_argument("--keda-factor", type=int, default=16, help="the keda-hpa baseline's fixed factor")
    parser.add_argument("--lag-threshold", type=float, default=500.0, help="the keda-hpa lagThreshold")
    parser.add_argument("--keep", default="", help="keep logs and timelines in this directory")
    parser.add_argument(
        "--cluster",
        choices=("double", "real"),
        default="double",
        help="where the operator variant runs: the emulated API server (double) or the real-cluster "
        "tier's control plane with the chart installed by Helm (real; docs/real-cluster.md)",
    )


@dataclass
class _KedaBaseline:
    """KEDA's Kafka scaler under the HPA (the simulator's :class:`KedaHpaPolicy`), deciding on its own
    15 s sync period inside the controller's 2 s interval, and keeping the factor it is given."""

    partitions: int
    lag_threshold: float
    max_replicas: int

    def __post_init__(self) -> None:
        from multilane.sim.policies import KedaHpaConfig, KedaHpaPolicy

        config = KedaHpaConfig(
            lag_threshold=self.lag_threshold, polling_interval_s=15.0, max_replicas=self.max_replicas
        )
        self.policy = KedaHpaPolicy(self.partitions, config)
        self.state: dict[str, Any] = self.policy.initial_state()
        self.last_sync: float | None = None

    def decide(self, obs: Any, state: Any) -> tuple[Any, Any]:
        from multilane.operator.decision.policy import Decision

        if self.last_sync is not None and obs.now - self.last_sync < self.policy.config.sync_period_s:
            hold = Decision(
                obs.replicas, obs.factor, "keda-hpa: between syncs", {}, False, [], rule="keda-hpa"
            )
            return hold, state
        self.last_sync = obs.now
        d, self.state = self.policy.decide(obs, self.state)
        return replace(d, factor=obs.factor, changed=d.replicas != obs.replicas, rule="keda-hpa"), state


def _factory(variant: str, partitions: int, args: argparse.Namespace, max_replicas: int) -> Any:
    from multilane.operator.decision.policy import AutoscalePolicy, PolicyConfig

    if variant == "keda-hpa":
        baseline = _KedaBaseline(partitions, args.lag_threshold, max_replicas)
        return lambda _config: baseline
    if variant == "before":

        def before(config: PolicyConfig) -> AutoscalePolicy:
            return AutoscalePolicy(
                replace(
                    config,
                    factor_first=False,
                    shortfall_margin=math.inf,
                    scale_down_tolerance=0.0,
                    rising_lag_threshold_s=config.backlog_threshold_s,
                    shortfall_input_ratio=math.inf,
                )
            )

        return before
    return None


async def _scenario(
    bootstrap: str, partitions: int, variant: str, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    """Steps 1-4 of the module docstring for one (partitions, variant); returns the row."""
    from multilane.demo.check import judge, read_counts
    from multilane.demo.report import Timeline, burst_figures
    from multilane.demo.run import _create_topic, _drained, record_pass, stateful_plane
    from multilane.operator.local.plane import WorkerStatusSource
    from multilane.operator.sources import QueryContext
    from multilane.testing.load import LoadgenProcess
    from multilane.testing.processors import read_event_log

    run = uuid.uuid4().hex[:6]
    topic = f"burst-{partitions}-{variant}-{run}"  # the group is named like the topic
    lull, burst = RATES.get(partitions, (10.0 * partitions, 100.0 * partitions))
    burst_s = args.burst_s or (15.0 if args.quick else 30.0)
    warm, tail = (8.0, 8.0) if args.quick else (10.0, 20.0)
    max_replicas = 3 if partitions <= 4 else 6
    fixed = variant == "keda-hpa"
    # 1.
    await asyncio.to_thread(_create_topic, bootstrap, topic, partitions)
    names = [f"{topic}/{i}" for i in range(partitions)]
    scaling: dict[str, Any] = {"maxReplicas": max_replicas, "maxFactor": 32}
    if fixed:
        scaling.update(minFactor=args.keda_factor, maxFactor=args.keda_factor)
    if variant == "before":
        scaling["maxPartitionsMovedAtOnce"] = 1
    events_log = workdir / f"events-{run}.log"
    cp = stateful_plane(
        bootstrap,
        topic,
        names,
        workdir / f"cp-{run}",
        events_log,
        scaling,
        sleep_ms=args.sleep_ms,
        factor=args.keda_factor if fixed else 2,
        extra_args=("--release-drain", "queued") if variant == "before" else (),
        name=f"b{run}",
        policy_factory=_factory(variant, partitions, args, max_replicas),
    )
    sampler = WorkerStatusSource(cp.platform, cp.control, cp.ref, cp.admin)
    ctx = QueryContext("local", "burst", topic, names)
    timeline = Timeline()
    profile = f"{lull:g}x{warm:g},{burst:g}x{burst_s:g},{lull:g}x{tail:g}"
    await cp.start()
    # wait until the first worker owns every partition (a fair start for every variant)
    deadline = time.monotonic() + 60
    while (
        len({p for m in (cp.status.get("assignment") or {}).get("members") or [] for p in m["partitions"]})
        < partitions
    ):
        if time.monotonic() > deadline:
            raise TimeoutError("the first worker did not take the partitions")
        await cp.tick()
        await asyncio.sleep(0.25)
    t0, wall0 = time.monotonic(), time.time()
    loadgen = LoadgenProcess(bootstrap, topic, profile, str(workdir), keys=5000, name=f"load-{run}")
    result = None
    last_sample = -1.0
    drained_at: float | None = None
    try:
        # 2.-3.
        while True:
            now = time.monotonic() - t0
            report = await cp.tick()
            if await record_pass(timeline, report, now, last_sample, cp, sampler, ctx, "load") is not None:
                last_sample = now
            if result is None and not loadgen.running():
                result, _rates = await asyncio.to_thread(loadgen.finish, 60.0)
            if result is not None:
                if drained_at is None and _drained(sampler.last_statuses, result):
                    drained_at = now
                if drained_at is not None and now - drained_at > 3:
                    break
            if now > warm + burst_s + tail + 90:
                raise TimeoutError("the backlog did not drain within 90 s of the end of the load")
            await asyncio.sleep(0.25)
    finally:
        if result is None:
            result, _rates = await asyncio.to_thread(loadgen.finish, 60.0, True)
        await cp.close()
    # 4.
    events = read_event_log(events_log)
    counts, _committed = await asyncio.to_thread(read_counts, bootstrap, topic, topic, range(partitions))
    verdict = judge(result.records, events, counts)
    figures = burst_figures(
        timeline.samples,
        timeline.events,
        warm + (loadgen.started - t0),
        warm + burst_s + (loadgen.started - t0),
        result.offered_per_s,
        result.delivered_per_s,
        clock_offset_s=loadgen.started - t0,
    )
    (workdir / f"timeline-{partitions}-{variant}-{run}.json").write_text(
        json.dumps({"events": timeline.events, "samples": [asdict(x) for x in timeline.samples]}, indent=1)
    )
    moves = list(cp.executor.completed if cp.executor is not None else [])
    return _row(partitions, variant, figures, moves, verdict, wall0, timeline.events, result)


async def _operator_scenario(
    bootstrap: str, partitions: int, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    """The ``multilane`` row through the kopf operator and the StatefulSet process double (the steps of
    :func:`benchmarks.k8s_burst.run_operator_burst`, the load and figures of :func:`_scenario`)."""
    from benchmarks.k8s_burst import BurstShape, run_operator_burst
    from multilane.demo.run import _create_topic

    run = uuid.uuid4().hex[:6]
    topic = f"burst-{partitions}-operator-{run}"
    lull, burst = RATES.get(partitions, (10.0 * partitions, 100.0 * partitions))
    burst_s = args.burst_s or (15.0 if args.quick else 30.0)
    warm, tail = (8.0, 8.0) if args.quick else (10.0, 20.0)
    await asyncio.to_thread(_create_topic, bootstrap, topic, partitions)
    shape = BurstShape(lull, burst, warm, burst_s, tail, sleep_ms=args.sleep_ms)
    max_replicas = 3 if partitions <= 4 else 6
    if args.cluster == "real":
        from benchmarks.k8s_burst_real import move_table, run_cluster_burst

        real, moved = await run_cluster_burst(bootstrap, topic, partitions, workdir, shape, max_replicas)
        log(move_table(moved, real.wall0))
        _keep_timeline(workdir / f"timeline-{partitions}-operator-real-{run}.json", real.timeline)
        events = real.timeline.events
        return _row(partitions, "operator", real.figures, moved, real.verdict, real.wall0, events, real.load)
    result = await run_operator_burst(
        bootstrap,
        topic,
        partitions,
        workdir,
        shape,
        CRD_PATH,
        max_replicas=max_replicas,
        tick_s=args.operator_tick,
    )
    timeline = result.timeline
    _keep_timeline(workdir / f"timeline-{partitions}-operator-{run}.json", timeline)
    return _row(
        partitions,
        "operator",
        result.figures,
        result.handoffs,
        result.verdict,
        result.wall0,
        timeline.events,
        result.load,
    )


def _keep_timeline(path: Path, timeline: Any) -> None:
    path.write_text(
        json.dumps({"events": timeline.events, "samples": [asdict(x) for x in timeline.samples]}, indent=1)
    )


def _row(
    partitions: int,
    variant: str,
    figures: Any,
    moves: list[Any],
    verdict: Any,
    wall0: float,
    events: list[tuple[float, str, str]],
    load: LoadResult,
) -> dict[str, Any]:
    """Step 4's row: the burst figures, the scale-up's rollout (moves released between the onset and
    the end of the burst, wall clock), the verdict, and whether the load generator delivered the
    offered burst (:func:`input_check`)."""
    onset_wall = wall0 + figures.onset_s
    up = [
        h for h in moves if h.released_at is not None and onset_wall <= h.released_at <= wall0 + figures.end_s
    ]
    span = None
    if up:
        span = max(h.promoted_at or h.released_at or 0.0 for h in up) - min(h.released_at or 0.0 for h in up)
    for t, reason, message in events:
        if reason == "ScalingDecision":
            log(f"  t={t:5.1f}s {message[:160]}")
    checks = (
        "ok"
        if verdict.ok
        else "FAILED: "
        + "; ".join(c.name for c in verdict.checks if not c.ok)
        + ("" if verdict.state_ok is not False else "; state")
    )
    return {
        "partitions": partitions,
        "variant": variant,
        "offered": round(figures.offered_rate),
        "achieved": round(figures.achieved_rate),
        "reaction_s": figures.reaction_s,
        "recovery_s": figures.recovery_s,
        "peak_lag": figures.peak_lag,
        "lag_seconds": round(figures.lag_seconds),
        "actions": figures.scale_actions,
        "ups": figures.scale_ups,
        "downs": figures.scale_downs,
        "size_changes": figures.size_changes,
        "downs_in_burst": figures.scale_downs_in_burst,
        "moves": len(up),
        "rollout_s": span,
        "max_pause_s": max((h.pause_s for h in up), default=None),
        "max_release_s": max((h.release_s for h in up if h.release_s is not None), default=None),
        "max_promote_s": max((h.promote_s for h in up if h.promote_s is not None), default=None),
        "lost": verdict.lost,
        "replayed": verdict.replayed,
        "checks": checks,
        "input": input_check(figures, load),
    }


SHORT_INPUT = 0.95  # a row whose achieved burst rate is below this share of the offered one is not compared


def input_check(figures: Any, load: LoadResult) -> str:
    """ "ok" when the burst's achieved rate (delivery reports per second) is >= SHORT_INPUT of the
    offered one, else "SHORT" with what explains it: records the generator skipped (it was starved of
    CPU beyond ``max_behind_s``), and the longest produce -> delivery time in the burst (the broker
    acknowledged late: records reached the topic after the burst's seconds). Such a row measured a
    smaller burst than the others: its figures are shown, never compared."""
    if figures.offered_rate <= 0 or figures.achieved_rate >= SHORT_INPUT * figures.offered_rate:
        return "ok"
    peak = max(load.offered_per_s, default=0.0)
    burst = [i for i, x in enumerate(load.offered_per_s) if x >= peak > 0]
    latency = max((load.latency_max_per_s[i] for i in burst if i < len(load.latency_max_per_s)), default=0.0)
    return (f"SHORT {figures.achieved_rate / figures.offered_rate:.0%} of offered: "
            f"{load.skipped:,} skipped, delivery latency up to {latency:.1f} s, producer ready after "
            f"{load.ready_s:.1f} s")


def body(args: argparse.Namespace, report: Report) -> None:
    sizes = tuple(int(s) for s in args.partitions.split(",") if s) or ((4,) if args.quick else (4, 24, 64))
    variants = [v for v in args.variants.split(",") if v in VARIANTS]
    passes = broker_passes(report, args.broker)  # before the tables: they lead with a broker column
    report.params.update(
        {
            "partitions": list(sizes),
            "variants": variants,
            "sleep_ms": args.sleep_ms,
            "rates": RATES,
            "operator_tick_s": args.operator_tick,
            "cluster": args.cluster,
        }
    )
    table = report.table(
        "burst",
        "A 10x step burst: reaction and recovery of the control plane (real workers; the local platform, "
        "or for variant operator the kopf operator with a pod per worker)",
        [
            Column("partitions"),
            Column("variant"),
            Column("offered", "offered rec/s", fmt=","),
            Column("achieved", "achieved rec/s", fmt=","),
            Column("reaction_s", "reaction (s)", fmt=".1f"),
            Column("recovery_s", "recovery (s)", fmt=".1f"),
            Column("peak_lag", "peak lag", fmt=","),
            Column("lag_seconds", "lag x s", fmt=","),
            Column("actions", "scaling actions"),
            Column("ups", "scale-ups"),
            Column("downs", "scale-downs"),
            Column("size_changes", "size changes"),
            Column("downs_in_burst", "scale-downs in burst"),
            Column("moves", "moves in the burst"),
            Column("rollout_s", "rollout (s)", fmt=".1f"),
            Column("max_pause_s", "longest move pause (s)", fmt=".2f"),
            Column("max_release_s", "longest release call (s)", fmt=".2f"),
            Column("max_promote_s", "longest promotion call (s)", fmt=".2f"),
            Column("lost"),
            Column("replayed"),
            Column("checks"),
            Column("input", "input (achieved >= 95% of offered)"),
        ],
    )
    rows: dict[tuple[str, int, str], dict[str, Any]] = {}  # rows whose input was the offered burst
    short: list[str] = []
    kinds: list[str] = []
    for kind in passes:
        kinds.append(kind)
        with broker_session(kind) as broker, tempfile.TemporaryDirectory(prefix="bench-burst-") as scratch:
            tmp = Path(args.keep or scratch) / kind
            tmp.mkdir(parents=True, exist_ok=True)
            for p in sizes:
                for variant in variants:
                    log(f"burst: {kind} broker, {p} partitions, {variant}")
                    try:
                        if variant == "operator":
                            row = asyncio.run(_operator_scenario(broker.bootstrap, p, args, tmp))
                        else:
                            row = asyncio.run(_scenario(broker.bootstrap, p, variant, args, tmp))
                    except Exception as exc:  # a row fails alone
                        table.add_unavailable(f"{type(exc).__name__}: {exc}", partitions=p, variant=variant)
                        continue
                    table.add(**row)
                    if row["input"] == "ok":
                        rows[(kind, p, variant)] = row
                    else:  # a smaller burst than offered: shown, never compared
                        short.append(f"{kind} broker, {p} partitions, {variant}: {row['input']}")
    ratios = report.table(
        "ratios",
        "multilane against the baselines of the same run (lower is better for multilane)",
        [
            Column("partitions"),
            Column("baseline"),
            Column("recovery", "recovery ratio", fmt=".2f"),
            Column("peak_lag", "peak-lag ratio", fmt=".2f"),
            Column("lag_seconds", "lag x s ratio", fmt=".2f"),
            Column("actions", "actions (multilane / baseline)"),
            Column("ups", "scale-ups (multilane / baseline)"),
        ],
    )
    for kind in kinds:
        report.stamp["broker"] = kind
        for p in sizes:
            ours = rows.get((kind, p, "multilane"))
            if ours is None:
                continue
            for base in ("before", "keda-hpa"):
                theirs = rows.get((kind, p, base))
                if theirs is None:
                    continue
                ratios.add(
                    partitions=p,
                    baseline=base,
                    recovery=ratio(ours["recovery_s"], theirs["recovery_s"]),
                    peak_lag=ratio(ours["peak_lag"], theirs["peak_lag"]),
                    lag_seconds=ratio(ours["lag_seconds"], theirs["lag_seconds"]),
                    actions=f"{ours['actions']} / {theirs['actions']}",
                    ups=f"{ours['ups']} / {theirs['ups']}",
                )
            if p in (4, 24):
                report.goal(f"recovery on {p} partitions (s)", ours["recovery_s"], 10.0, "<=")
            before = rows.get((kind, p, "before"))
            if before is not None:
                report.goal(
                    f"scale-ups multilane - before on {p} partitions",
                    float(ours["ups"] - before["ups"]),
                    0.0,
                    "<=",
                )
                report.goal(
                    f"peak lag multilane / before on {p} partitions",
                    ratio(ours["peak_lag"], before["peak_lag"]),
                    0.25,
                    "<=",
                )
            report.goal(f"longest move pause on {p} partitions (s)", ours["max_pause_s"], 0.5, "<=")
            if ours["moves"] >= 12:
                report.goal(
                    f"rollout of {ours['moves']} moves on {p} partitions (s)", ours["rollout_s"], 8.0, "<="
                )
    report.stamp.pop("broker", None)
    if short:
        report.errors.append(
            f"{len(short)} row(s) measured a smaller burst than offered (achieved < {SHORT_INPUT:.0%}); "
            "their ratios and goals are left out: " + "; ".join(short)
        )
    report.note(
        "scaling actions = scale-ups and scale-downs; a factor-follows decision (the factor rising as "
        "the pods of a pending scale-up become ready) completes that scale-up and is counted only in "
        "'size changes'. The goal compares scale-ups, the answer to the burst: a policy that scales up "
        "late also scales down late, after the run ends, so a count of all actions would favour it; "
        "scale-downs are shown beside them."
    )
    if "operator" in variants and args.cluster == "real":
        report.note(
            "variant operator on --cluster real = the multilane row through the chart installed by Helm "
            "on the real-cluster tier (kube-apiserver, etcd, kube-controller-manager v1.34.4, the process "
            "kubelet; docs/real-cluster.md): two operator replicas as pods (their own control-loop "
            "period; --operator-tick does not apply), a worker process per pod. Decisions and moves are "
            "the operator's Events (ScalingDecision, HandedOff) read from kube-apiserver: a move's "
            "pause is the operator's figure, its release time the Event's time minus the pause (the "
            "rollout is an upper bound) and the release and promotion calls apart are not reported. "
            "Samples come from Kafka committed and end offsets (the workers' control port is on "
            "mutual TLS), so the processing rate moves in commit steps."
        )
    elif "operator" in variants:
        report.note(
            "variant operator = the multilane row through the kopf operator (a timer every "
            f"{args.operator_tick:g} s) against the emulated API server, a real worker process per pod "
            "of the rendered StatefulSet (multilane.testing.pods), its own Lease per pod, and the "
            "operator's default metric source (Kafka committed and end offsets); the local plane "
            "decides from the workers' /v1/status. Figures are measured the same way for both."
        )
    report.note(
        "reaction = burst onset -> first scale decision; recovery = onset -> processing >= 95% of the "
        "burst's achieved input for 3 s; rollout = first release -> last promotion; a move's pause = "
        "release call -> end of the promotion call (the control plane's figure)."
    )


if __name__ == "__main__":
    raise SystemExit(
        main("burst", "Burst response: the control plane against a 10x step burst.", body, add_arguments)
    )
