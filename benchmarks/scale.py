"""Scale benchmark: the control plane at hundreds of partitions and tens of pods.

Does I/O: ``processes`` rows start an embedded broker and worker subprocesses on the local platform;
``control pass`` rows run in memory.

Two tables:

1. **Control pass** (in memory, sizes no machine here runs as processes): one whole
   ``ConsumerController.tick`` with the ``HandoffExecutor`` -- every worker's status read, the metric
   sample, the policy decision, the plan, the rollout step and its (batched) calls, the status write
   (``json.dumps`` of the merged status and of the policy state) and the Events -- over
   :class:`multilane.testing.fleet.WorkerFleetDouble` workers. Steady state, then a rollout from half
   the pods to all of them. Reported: median and worst pass (ms), CPU per pass, the status size.
   Goal at 1,000 partitions x 50 pods: a pass < 100 ms and the status < 256 KiB.
2. **Processes** (full run only, or ``--processes``): P partitions under light load on real
   ``multilane worker`` processes (stateless, key mode), the local control plane scales 1 -> N -> 1
   workers (``spec.scaling.replicas`` pinned). Reported: time to converge each way, the longest
   per-partition pause (control plane's figure), most moves in flight at once, control-plane CPU per
   pass, the largest worker RSS, and the delivery checkers on the processing log.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks._common import Column, Report, log, main
from benchmarks._data import broker_session

PASS_SIZES_FULL = ((128, 8), (1000, 50))
PASS_SIZES_QUICK = ((128, 8), (1000, 50))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--processes", default="", help="PARTITIONS:WORKERS for the process rows (full: 128:8)"
    )
    parser.add_argument("--rate", type=float, default=2.0, help="records/s per partition in the process rows")


# -- 1. control pass ---------------------------------------------------------------------------------


class _Platform:
    """The pods of a StatefulSet, in memory."""

    def __init__(self, fleet: Any, replicas: int) -> None:
        self.fleet = fleet
        self.replicas = replicas

    async def ensure_workers(self, ref: Any, replicas: int) -> None:
        self.replicas = replicas

    async def current_workers(self, ref: Any) -> int:
        return self.replicas

    async def list_workers(self, ref: Any) -> list[Any]:
        from multilane.testing.fleet import fleet_infos

        return fleet_infos(self.fleet, [f"w-{i}" for i in range(self.replicas)])


class _Source:
    def __init__(self, partitions: list[str]) -> None:
        self.partitions = partitions
        self.rng = random.Random(7)

    async def sample(self, ctx: Any) -> Any:
        from multilane.operator.sources import MetricSample

        lag = {p: self.rng.randint(0, 50) for p in self.partitions}
        return MetricSample(
            lag=lag, input_rate=2.0 * len(lag), processing_rate=2.0 * len(lag), time=time.time()
        )


async def _control_passes(partitions: int, pods: int) -> dict[str, Any]:
    from multilane.operator.controller import ConsumerController
    from multilane.operator.decision.policy import PolicyState
    from multilane.operator.rollout.assignment import AssignmentState
    from multilane.operator.rollout.handoff import HandoffConfig, HandoffExecutor
    from multilane.operator.rollout.protocol import Rollout
    from multilane.operator.spec.children import ConsumerRef
    from multilane.operator.spec.validation import validate_spec
    from multilane.testing.fleet import WorkerFleetDouble

    names = [f"orders/{i}" for i in range(partitions)]
    spec, problems = validate_spec(
        {
            "kafka": {"bootstrapServers": "k:9092", "topics": ["orders"], "consumerGroup": "g"},
            "workload": {"image": "i", "processor": "m:f"},
            "scaling": {"minReplicas": 1, "maxReplicas": pods, "replicas": pods // 2, "maxFactor": 64,
                        "intervalSeconds": 1},
        }
    )  # fmt: skip
    if spec is None:
        raise ValueError(f"invalid spec: {problems}")
    specs = [spec]  # the CR as edited: the last one is in force
    fleet = WorkerFleetDouble([f"w-{i}" for i in range(pods)], learn_ticks=1)
    platform = _Platform(fleet, pods // 2)
    status: dict[str, Any] = {}
    state = {"policy": PolicyState()}

    async def persist(a: AssignmentState, r: Rollout | None = None) -> None:
        status["assignment"] = a.to_status()
        status["rollout"] = r.to_dict() if r is not None else None

    executor = HandoffExecutor(
        fleet, persist, HandoffConfig(acceptable_recovery_lag=0, max_concurrent_warmups=4)
    )
    clock = [1_000_000.0]
    controller = ConsumerController(platform, fleet, handoff=executor, clock=lambda: clock[0])
    ref = ConsumerRef(name="orders", namespace="team-a", uid="u")
    source = _Source(names)
    ms: dict[str, list[float]] = {"steady": [], "rollout": []}
    cpu: list[float] = []
    sizes: list[int] = []
    events = 0

    async def one(kind: str) -> None:
        nonlocal events
        clock[0] += 2.0  # every pass decides (interval 1 s)
        t0, c0 = time.perf_counter(), time.process_time()
        result = await controller.tick(ref, specs[-1], status, state["policy"], names, source, persist)
        status.update(result.status)
        if result.policy_state is not None:
            state["policy"] = result.policy_state
        text = json.dumps(status)  # the status write
        json.dumps(state["policy"].to_dict())  # the policy-state annotation
        events += len(result.events)
        ms[kind].append(1000 * (time.perf_counter() - t0))
        cpu.append(1000 * (time.process_time() - c0))
        sizes.append(len(text.encode()))

    # steady: half the pods own everything
    for _ in range(30):
        await one("steady")
        if (
            status.get("rollout") is None
            and len(status.get("assignment", {}).get("members") or []) == pods // 2
        ):
            break
    for _ in range(10):
        await one("steady")
    # a rollout to all the pods
    specs.append(dataclasses.replace(spec, replicas=pods))
    passes = 0
    while passes < 2000:
        await one("rollout")
        passes += 1
        if status.get("rollout") is None and len(status["assignment"]["members"]) == pods:
            break
    members = status["assignment"]["members"]
    assert sorted(p for m in members for p in m["partitions"]) == sorted(names), "lost a partition"
    return {
        "partitions": partitions,
        "pods": pods,
        "steady_median_ms": statistics.median(ms["steady"]),
        "rollout_median_ms": statistics.median(ms["rollout"]),
        "worst_ms": max(ms["steady"] + ms["rollout"]),
        "cpu_ms": statistics.median(cpu),
        "rollout_passes": passes,
        "moves": len(executor.completed),
        "status_kib": max(sizes) / 1024,
        "events": events,
    }


# -- 2. processes ------------------------------------------------------------------------------------


def _rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


async def _processes(
    bootstrap: str, partitions: int, workers: int, rate: float, workdir: Path
) -> dict[str, Any]:
    from multilane.demo.check import judge
    from multilane.demo.run import _create_topic
    from multilane.operator.local.plane import LocalControlPlane, LocalWorkerTemplate
    from multilane.operator.rollout.handoff import HandoffConfig
    from multilane.operator.spec.validation import validate_spec
    from multilane.testing.load import LoadgenProcess
    from multilane.testing.processors import read_event_log

    run = uuid.uuid4().hex[:6]
    topic = group = f"scale-{partitions}-{run}"
    await asyncio.to_thread(_create_topic, bootstrap, topic, partitions)
    names = [f"{topic}/{i}" for i in range(partitions)]
    spec, problems = validate_spec(
        {
            "kafka": {"bootstrapServers": bootstrap, "topics": [topic], "consumerGroup": group},
            "workload": {"image": "local", "processor": "multilane.testing.processors:logging_async"},
            "scaling": {"minReplicas": 1, "maxReplicas": workers, "replicas": 1, "minFactor": 2,
                        "maxFactor": 2, "intervalSeconds": 1},
        }
    )  # fmt: skip
    assert spec is not None, problems
    events_log = workdir / f"events-{run}.log"
    template = LocalWorkerTemplate(
        bootstrap, group, "multilane.testing.processors:logging_async", factor=2, drain_timeout_s=10.0,
        env={"MULTILANE_TEST_LOG": str(events_log), "MULTILANE_TEST_SLEEP_MS": "1"},
    )  # fmt: skip
    cp = LocalControlPlane(
        workdir / f"cp-{run}", spec, template, names,
        HandoffConfig(acceptable_recovery_lag=1000, learner_timeout_s=60.0, release_deadline_s=2.0),
        name=f"s{run}",
    )  # fmt: skip
    in_flight = 0
    cpu_per_pass: list[float] = []
    rss: list[int] = []

    def owners() -> dict[str, str]:
        members = (cp.status.get("assignment") or {}).get("members") or []
        return {p: m["worker"] for m in members for p in m["partitions"]}

    async def until(cond: Any, limit_s: float, what: str) -> float:
        nonlocal in_flight
        t0 = time.monotonic()
        while not cond():
            if time.monotonic() - t0 > limit_s:
                raise TimeoutError(f"{what} not reached in {limit_s:.0f}s")
            c0 = time.process_time()
            await cp.tick()
            cpu_per_pass.append(1000 * (time.process_time() - c0))
            moves = (cp.status.get("rollout") or {}).get("moves") or []
            in_flight = max(
                in_flight, sum(1 for m in moves if m["phase"] in ("learning", "releasing", "promoting"))
            )
            for pid in cp.platform.workers().values():
                kib = _rss_kib(pid)
                if kib is not None:
                    rss.append(kib)
            await asyncio.sleep(0.1)
        return time.monotonic() - t0

    def spread(n: int) -> bool:
        o = owners()
        return (
            len(o) == partitions
            and len(set(o.values())) == n
            and not cp.status.get("rollout")
            and cp.platform.replicas == n
        )

    loadgen = None
    try:
        await cp.start()
        await until(lambda: spread(1), 120, "every partition on the first worker")
        profile = f"{rate * partitions:g}x600"
        loadgen = LoadgenProcess(bootstrap, topic, profile, str(workdir), keys=10_000, name=f"load-{run}")
        await asyncio.sleep(3)
        cp.spec = dataclasses.replace(spec, replicas=workers)
        up = await until(lambda: spread(workers), 600, f"spread over {workers} workers")
        await asyncio.sleep(3)
        cp.spec = dataclasses.replace(spec, replicas=1)
        down = await until(lambda: spread(1), 600, "back on one worker")
        await asyncio.sleep(2)
    finally:
        result = None
        if loadgen is not None:
            result, _ = await asyncio.to_thread(loadgen.finish, 60.0, True)
        await cp.close()
    moves = cp.executor.completed if cp.executor is not None else []
    verdict = judge(result.records if result is not None else [], read_event_log(events_log), None)
    return {
        "partitions": partitions,
        "workers": workers,
        "up_s": up,
        "down_s": down,
        "moves": len(moves),
        "max_pause_s": max((m.pause_s for m in moves), default=None),
        "max_in_flight": in_flight,
        "cp_cpu_ms": statistics.median(cpu_per_pass) if cpu_per_pass else None,
        "worker_rss_mib": max(rss) / 1024 if rss else None,
        "lost": verdict.lost,
        "checks": "ok" if verdict.ok else "FAILED: " + "; ".join(c.name for c in verdict.checks if not c.ok),
    }


def body(args: argparse.Namespace, report: Report) -> None:
    sizes = PASS_SIZES_QUICK if args.quick else PASS_SIZES_FULL
    report.params.update({"control_pass_sizes": [list(s) for s in sizes]})
    passes = report.table(
        "control_pass",
        "One control pass (status reads, metrics, decision, plan, rollout step, status write, Events), "
        "in memory",
        [
            Column("partitions", fmt=","),
            Column("pods"),
            Column("steady_median_ms", "steady pass (ms, median)", fmt=".1f"),
            Column("rollout_median_ms", "rollout pass (ms, median)", fmt=".1f"),
            Column("worst_ms", "worst pass (ms)", fmt=".1f"),
            Column("cpu_ms", "CPU per pass (ms, median)", fmt=".1f"),
            Column("rollout_passes", "passes of the rollout"),
            Column("moves"),
            Column("status_kib", "largest status (KiB)", fmt=".1f"),
            Column("events"),
        ],
    )
    found: dict[tuple[int, int], dict[str, Any]] = {}
    for p, pods in sizes:
        log(f"scale: control pass at {p} partitions x {pods} pods")
        try:
            found[(p, pods)] = passes.add(**asyncio.run(_control_passes(p, pods)))
        except Exception as exc:
            passes.add_unavailable(f"{type(exc).__name__}: {exc}", partitions=p, pods=pods)
    big = found.get((1000, 50))
    if big is not None:
        report.goal("worst control pass at 1,000 partitions x 50 pods (ms)", big["worst_ms"], 100.0, "<")
        report.goal("largest status at 1,000 partitions x 50 pods (KiB)", big["status_kib"], 256.0, "<")
    spec = args.processes or ("" if args.quick else "128:8")
    if spec:
        p, w = (int(x) for x in spec.split(":"))
        procs = report.table(
            "processes",
            f"Real workers: {p} partitions scaled 1 -> {w} -> 1 "
            f"(light load, {args.rate:g} rec/s per partition)",
            [
                Column("partitions"),
                Column("workers"),
                Column("up_s", "converge up (s)", fmt=".1f"),
                Column("down_s", "converge down (s)", fmt=".1f"),
                Column("moves"),
                Column("max_pause_s", "longest move pause (s)", fmt=".2f"),
                Column("max_in_flight", "most moves in flight"),
                Column("cp_cpu_ms", "control-plane CPU per pass (ms)", fmt=".1f"),
                Column("worker_rss_mib", "largest worker RSS (MiB)", fmt=".0f"),
                Column("lost"),
                Column("checks"),
            ],
        )
        with broker_session() as broker, tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
            log(f"scale: {p} partitions, 1 -> {w} -> 1 workers")
            try:
                procs.add(**asyncio.run(_processes(broker.bootstrap, p, w, args.rate, Path(tmp))))
            except Exception as exc:
                procs.add_unavailable(f"{type(exc).__name__}: {exc}", partitions=p, workers=w)
    report.note(
        "control pass: WorkerFleetDouble workers answer at once, so the figure is the control plane's "
        "own cost (no network); the status size is json.dumps of the merged status."
    )


if __name__ == "__main__":
    raise SystemExit(
        main("scale", "Scale: the control plane at many partitions and pods.", body, add_arguments)
    )
