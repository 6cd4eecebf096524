"""``multilane demo``: autoscaling with restore-before-handoff on one machine. Does I/O (starts a broker
and worker processes, produces load, writes ``--out``).

What it runs (steps 1-7, numbered as in :func:`_demo`):

1. The embedded broker (or ``--bootstrap-servers``), a topic with ``--partitions`` partitions.
2. The local control plane (:class:`multilane.operator.local.LocalControlPlane`): the operator's
   ``ConsumerController`` and ``HandoffExecutor`` over worker subprocesses, starting with ONE worker
   running :func:`multilane.demo.processors.stateful_io` (per-key counter in ``ctx.state`` + ~10 ms of
   async I/O) at factor 1.
3. The load generator: a lull, a burst, a long lull (delivery reports give the exact produced set).
4. Every tick: the control plane decides (factor and replicas), moves partitions with
   restore-before-handoff, scales back down; the live table (or plain lines when stdout is not a TTY)
   shows lag, rates, replicas, factor and each partition's phase and owner.
5. Drain: wait until every partition's committed offset reached the end of what was produced.
6. Stop the workers (drain + final commit) and judge: delivery checkers on the processing log
   (at-least-once, per-key order, no concurrent work on a key), state restored from the changelog
   equals the per-key counts of the produced set.
7. Summary (produced, processed, replayed, lost, each handoff's pause) and a PNG plot in ``--out``.

Exit code: 0 when nothing was lost and every check passed, 1 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

__all__ = ["add_arguments", "run"]

log = logging.getLogger("multilane.demo")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--duration", type=float, default=120.0, help="seconds of load (lull, burst, lull); default 120")
    a("--bootstrap-servers", default=None, help="use this broker instead of starting the embedded one")
    a("--out", default="multilane-demo-out", help="directory for the plot, summary and logs")
    a("--partitions", type=int, default=4)
    a("--keys", type=int, default=5000, help="distinct keys (uniform)")
    a("--base-rate", type=float, default=120.0, help="records/s outside the burst")
    a("--burst-rate", type=float, default=1500.0, help="records/s during the burst")
    a("--sleep-ms", type=float, default=50.0, help="simulated remote I/O per record (ms)")
    a("--max-replicas", type=int, default=3)
    a("--max-in-flight", type=int, default=10_000, help="records in flight per worker")
    a("--max-factor", type=int, default=32)
    a("--plain", action="store_true", help="plain progress lines even on a TTY")
    a("--log-level", default="WARNING", help="log level of the control plane (stderr)")


def _profile(duration: float, base: float, burst: float) -> tuple[Any, list[tuple[float, str]], str]:
    from multilane.testing.loadgen import RateProfile, RateStep

    warm, peak = 0.1 * duration, 0.3 * duration
    steps = (RateStep(base, warm), RateStep(burst, peak), RateStep(base, duration - warm - peak))
    marks = [(warm, "lull"), (warm + peak, "burst"), (duration, "lull"), (float("inf"), "drain")]
    # the lull is long: the autoscaler scales down only once the backlog is gone and the
    # scale-down delay passed
    text = ",".join(f"{st.rate:g}x{st.duration_s:g}" for st in steps)
    return RateProfile(steps), marks, text


def _load_name(marks: list[tuple[float, str]], t: float) -> str:
    for end, name in marks:
        if t < end:
            return name
    return "drain"


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.duration < 20 or args.partitions < 1 or args.max_replicas < 1 or args.max_factor < 1:
        print("multilane demo: need --duration >= 20 and positive sizes", file=sys.stderr)
        return 2
    args.out_path = Path(args.out).absolute()
    args.out_path.mkdir(parents=True, exist_ok=True)
    try:
        return asyncio.run(_demo(args))
    except KeyboardInterrupt:
        return 130


async def _demo(args: argparse.Namespace) -> int:
    from multilane.demo.check import judge, read_counts
    from multilane.demo.report import (
        HandoffPause,
        Timeline,
        burst_figures,
        plot,
        processing_gap,
        summary_lines,
    )
    from multilane.operator.local.plane import WorkerStatusSource
    from multilane.operator.sources import QueryContext
    from multilane.testing.broker import EmbeddedBroker
    from multilane.testing.load import LoadgenProcess
    from multilane.testing.loadgen import LoadResult
    from multilane.testing.processors import read_event_log

    out: Path = args.out_path
    run_id = uuid.uuid4().hex[:6]
    events_log = out / f"events-{run_id}.log"
    tty = sys.stdout.isatty() and not args.plain
    broker = None
    # 1. broker and topic
    if args.bootstrap_servers:
        bootstrap = args.bootstrap_servers
    else:
        broker = EmbeddedBroker(log_path=out / "broker.log").start()
        bootstrap = broker.bootstrap
    topic = group = f"demo-{run_id}"
    try:
        _create_topic(bootstrap, topic, args.partitions)
        partitions = [f"{topic}/{i}" for i in range(args.partitions)]
        # 2. control plane
        try:
            cp = stateful_plane(
                bootstrap,
                topic,
                partitions,
                out / f"control-plane-{run_id}",
                events_log,
                scaling={
                    "maxReplicas": args.max_replicas,
                    "maxFactor": args.max_factor,
                    "scaleDownDelaySeconds": 2 * round(max(10.0, args.duration * 0.15) / 2),  # whole ticks
                },
                sleep_ms=args.sleep_ms,
                max_in_flight=args.max_in_flight,
                name="demo",
            )
        except ValueError as exc:
            print(f"multilane demo: {exc}", file=sys.stderr)
            return 2
        sampler = WorkerStatusSource(cp.platform, cp.control, cp.ref, cp.admin)
        ctx = QueryContext("local", "demo", group, partitions)
        timeline = Timeline()
        await cp.start()
        print(
            f"multilane demo: broker {bootstrap}, topic {topic} ({args.partitions} partitions), "
            f"1 worker at factor 2; {args.duration:.0f}s of load; output in {out}",
            flush=True,
        )
        # 3. load, from its own process (it holds its rate beside the control plane)
        profile, marks, profile_text = _profile(args.duration, args.base_rate, args.burst_rate)
        load: dict[str, LoadResult] = {}
        t0 = time.monotonic()
        producer = LoadgenProcess(
            bootstrap, topic, profile_text, str(out), keys=args.keys, zipf_s=0.0, seed=1
        )
        load_offset = producer.started - t0
        # 4.-5. control loop, display, drain
        peak = {"replicas": 1, "factor": 1}
        live = _Display(tty)
        drain_deadline: float | None = None
        drained_at: float | None = None
        settled_at: float | None = None
        last_sample = 0.0
        try:
            while True:
                now = time.monotonic() - t0
                try:
                    report = await cp.tick()
                except Exception:
                    log.exception("control-plane tick failed")
                    await asyncio.sleep(0.5)
                    continue
                sample = await record_pass(timeline, report, now, last_sample, cp, sampler, ctx,
                                           _load_name(marks, now), live.event)
                if sample is not None:
                    last_sample = now
                    peak["replicas"] = max(peak["replicas"], sample.replicas)
                    peak["factor"] = max(peak["factor"], sample.factor)
                    live.show(sample, timeline, int(profile.due(min(now, profile.duration_s))))
                if not producer.running():
                    if "result" not in load:
                        load["result"], _rates = await asyncio.to_thread(producer.finish, 60.0)
                    if drain_deadline is None:
                        drain_deadline = time.monotonic() + 90.0
                        live.event(now, "Drain", "load finished; waiting until everything is committed")
                    if drained_at is None and _drained(sampler.last_statuses, load.get("result")):
                        drained_at = time.monotonic()
                        live.event(now, "Drained", "everything committed; waiting for the scale-down")
                    # after the drain, give the autoscaler up to 45 s to scale back down
                    scaled_down = cp.platform.replicas <= 1 and not cp.status.get("rollout")
                    if scaled_down and settled_at is None:
                        settled_at = time.monotonic()
                    if settled_at is not None and time.monotonic() - settled_at > 4:
                        break  # a few more samples show the replicas back at 1
                    if drained_at is not None and time.monotonic() - drained_at > 45:
                        break
                    if time.monotonic() > drain_deadline + 45:
                        break
                await asyncio.sleep(0.25)
        finally:
            live.stop()
            try:
                if "result" not in load:
                    load["result"], _rates = await asyncio.to_thread(producer.finish, 60.0, True)
            except RuntimeError as exc:
                print(f"multilane demo: {exc}", file=sys.stderr)
            # 6. the last scrape of every metrics endpoint (Prometheus text format; docs/dashboard.md
            # says which panel shows what), then stop the workers cleanly and judge
            await asyncio.to_thread(_metrics_snapshot, cp, out / "metrics.prom")
            await cp.close()
        elapsed = time.monotonic() - t0
        result = load.get("result")
        produced = result.records if result is not None else []
        events = read_event_log(events_log) if events_log.exists() else []
        counts, _committed = await asyncio.to_thread(
            read_counts, bootstrap, group, topic, range(args.partitions)
        )
        verdict = judge(produced, events, counts)
        ends: dict[str, list[float]] = {}
        for e in events:
            if e.kind == "end":
                ends.setdefault(f"{e.topic}/{e.partition}", []).append(e.time)
        for i, hp in enumerate(timeline.handoffs):
            r = hp.record
            gap = None
            if r.released_at is not None and r.promoted_at is not None:
                gap = processing_gap(ends, r.partition, r.released_at, r.promoted_at)
            timeline.handoffs[i] = HandoffPause(r, hp.at, gap)
        # 7. summary and plot
        burst = None
        if result is not None:
            timeline.offered_per_s = result.offered_per_s
            timeline.delivered_per_s = result.delivered_per_s
            # the profile's second 0 on this clock: the generator's own, known once it finished
            load_offset = producer.started - t0
            onset, end = marks[0][0] + load_offset, marks[1][0] + load_offset
            burst = burst_figures(
                timeline.samples,
                timeline.events,
                onset,
                end,
                result.offered_per_s,
                result.delivered_per_s,
                clock_offset_s=load_offset,
            )
        png = None
        if timeline.samples:
            png = plot(
                timeline, out / "demo.png", f"multilane demo: {args.partitions} partitions, stateful IO-bound"
            )
        lines = summary_lines(verdict, timeline, elapsed, png, peak, burst)
        if (out / "metrics.prom").exists():
            lines.insert(-1, f"metrics snapshot    {out / 'metrics.prom'}  (panels: docs/dashboard.md)")
        print("\n".join(lines), flush=True)
        (out / "summary.txt").write_text("\n".join(lines) + "\n")
        (out / "timeline.json").write_text(
            json.dumps(
                {
                    "samples": [asdict(s) for s in timeline.samples],
                    "burst": None if burst is None else asdict(burst),
                    "offered_per_s": timeline.offered_per_s,
                    "delivered_per_s": timeline.delivered_per_s,
                    "events": timeline.events,
                    "handoffs": [
                        {**asdict(h.record), "at": h.at, "processing_gap_s": h.processing_gap_s}
                        for h in timeline.handoffs
                    ],
                },
                indent=1,
            )
        )
        return 0 if verdict.ok else 1
    finally:
        if broker is not None:
            broker.stop()


DEMO_SCALING: dict[str, Any] = {
    "minReplicas": 1,
    "minFactor": 2,
    "targetCatchUpSeconds": 5,
    "targetUtilisation": 0.7,
    "scaleDownDelaySeconds": 18,
    "stabilisationSeconds": 4,
    "intervalSeconds": 2,
    "maxPartitionsMovedAtOnce": 4,
    "maxLanesPerReplica": 64,
}
"""``spec.scaling`` of the demo (and of the burst benchmark): decisions every 2 s, a 5 s catch-up."""


def stateful_plane(
    bootstrap: str,
    topic: str,
    partitions: list[str],
    root: Path,
    events_log: Path,
    scaling: dict[str, Any],
    sleep_ms: float,
    max_in_flight: int = 10_000,
    factor: int = 2,
    extra_args: tuple[str, ...] = (),
    name: str = "demo",
    policy_factory: Any = None,
) -> Any:
    """The demo's local control plane (:class:`~multilane.operator.local.LocalControlPlane`) over
    workers running :func:`multilane.demo.processors.stateful_io`, starting at ``factor``; ``scaling``
    overrides :data:`DEMO_SCALING`. The group is named like the topic. Raises ValueError on a bad
    spec. Used by the demo and ``benchmarks.burst``."""
    from multilane.demo.processors import SLEEP_ENV
    from multilane.operator.local.plane import LocalControlPlane, LocalWorkerTemplate
    from multilane.operator.rollout.handoff import HandoffConfig
    from multilane.operator.spec.validation import validate_spec

    processor = "multilane.demo.processors:stateful_io"
    spec, problems = validate_spec(
        {
            "kafka": {"bootstrapServers": bootstrap, "topics": [topic], "consumerGroup": topic},
            "workload": {"image": "local", "processor": processor},
            "scaling": {**DEMO_SCALING, **scaling},
        }
    )
    if spec is None:
        raise ValueError(f"invalid spec: {problems}")
    template = LocalWorkerTemplate(
        bootstrap,
        topic,
        processor,
        factor=factor,
        drain_timeout_s=10.0,
        extra_args=("--max-in-flight", str(max_in_flight), *extra_args),
        env={"MULTILANE_TEST_LOG": str(events_log), SLEEP_ENV: str(sleep_ms)},
    )
    handoff = HandoffConfig(
        acceptable_recovery_lag=2000,
        learner_timeout_s=30.0,
        release_deadline_s=2.0,
        max_concurrent_warmups=spec.max_moves,
    )
    return LocalControlPlane(
        root, spec, template, partitions, handoff, name=name, policy_factory=policy_factory, metrics_port=0
    )


async def record_pass(
    timeline: Any,
    report: Any,
    now: float,
    last_sample: float,
    cp: Any,
    sampler: Any,
    ctx: Any,
    load: str,
    on_event: Any = None,
) -> Any:
    """Record one control-plane pass in ``timeline`` (steps 1-2): the demo's and ``benchmarks.burst``'s.

    1. The pass's events (scale decisions only, not holds) and completed handoffs; ``on_event(t,
       reason, message)`` sees each event too.
    2. Once a second (``now - last_sample >= 1``): a metrics sample. Returns it (None otherwise).
    """
    from multilane.demo.report import HandoffPause
    from multilane.operator.sources import MetricsUnavailableError

    # 1.
    for _kind, reason, message in report.events:
        if reason != "ScalingDecision" or message.startswith("scale "):
            timeline.events.append((now, reason, message))
            if on_event is not None:
                on_event(now, reason, message)
    for record in report.handoffs:
        timeline.handoffs.append(HandoffPause(record, now, None))
    # 2.
    if now - last_sample < 1.0:
        return None
    try:
        m = await sampler.sample(ctx)
    except MetricsUnavailableError:
        m = None
    sample = _sample(now, m, cp.status, report, [*ctx.partitions], load)
    timeline.samples.append(sample)
    return sample


def _metrics_snapshot(cp: Any, path: Path) -> None:
    """Write the workers' and the control plane's metrics to ``path`` (a failure is logged, not fatal:
    the snapshot is a by-product of the run)."""
    from multilane.testing.metrics_snapshot import write_metrics_snapshot

    endpoints = {
        f"http://127.0.0.1:{port}/metrics": {"job": "multilane-workers", "pod": name}
        for name, port in cp.platform.metrics_ports().items()
    }
    if cp.metrics_port:
        endpoints[f"http://127.0.0.1:{cp.metrics_port}/metrics"] = {"job": "multilane-operator"}
    try:
        write_metrics_snapshot(path, endpoints)
    except Exception as exc:
        log.warning("metrics snapshot not written: %s", exc)


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=-1)])[topic].result(15)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        t = admin.list_topics(topic, timeout=5).topics.get(topic)
        if t is not None and t.error is None and len(t.partitions) == partitions:
            return
        time.sleep(0.05)
    raise RuntimeError(f"topic {topic} did not appear")


def _sample(now: float, m: Any, status: dict[str, Any], report: Any, partitions: list[str], load: str) -> Any:
    from multilane.demo.report import DemoSample

    alive = sum(1 for w in report.workers if w.alive)
    return DemoSample.from_status(now, m, status, alive, partitions, load)


def _drained(statuses: dict[str, dict[str, Any]], result: Any) -> bool:
    """Every partition's committed offset reached the end of what was produced to it."""
    if result is None:
        return True
    ends: dict[tuple[str, int], int] = {}
    for r in result.records:
        ends[(r.topic, r.partition)] = max(ends.get((r.topic, r.partition), 0), r.offset + 1)
    committed: dict[tuple[str, int], int] = {}
    for st in statuses.values():
        for p in st.get("partitions") or []:
            if p.get("committed") is not None:
                committed[(str(p["topic"]), int(p["partition"]))] = int(p["committed"])
    return all(committed.get(tp, -1) >= end for tp, end in ends.items())


class _Display:
    """Live rich table on a TTY; plain periodic lines otherwise (CI logs)."""

    def __init__(self, tty: bool, every_s: float = 5.0) -> None:
        self.tty = tty
        self.every_s = every_s
        self._last = -1e9
        self._live: Any = None
        if tty:
            from rich.live import Live

            self._live = Live(refresh_per_second=4, transient=False)
            self._live.start()

    def show(self, sample: Any, timeline: Any, produced: int) -> None:
        from multilane.demo.report import live_view, plain_line

        if self._live is not None:
            self._live.update(live_view(sample, timeline, produced))
        elif sample.t - self._last >= self.every_s:
            self._last = sample.t
            print(plain_line(sample), flush=True)

    def event(self, t: float, reason: str, message: str) -> None:
        if self._live is None:
            print(f"t={t:5.0f}s event {reason}: {message}", flush=True)

    def stop(self) -> None:
        if self._live is not None:
            with contextlib.suppress(Exception):
                self._live.stop()
            self._live = None
