"""API-server load benchmark: what the operator asks of kube-apiserver at steady state.

Does I/O: an emulated API server on loopback (:mod:`multilane.testing.kube_api`, counting every
request it serves), the real kopf operator in a thread (:class:`~multilane.testing.kopf_runner.
OperatorRunner`, production tick of 5 s), and in-memory doubles for the rest: workers
(:class:`~multilane.testing.fleet.WorkerFleetDouble`), the metric source (constant rates, no lag) and
the Kafka admin client (4 partitions per topic). No broker, no worker process.

Per size (1, 10 and 100 consumers):

1. Create the ParallelConsumers; act as the StatefulSet controller and the workers once, before the
   operator starts (one pod per consumer with a Ready condition and the annotations of the template
   the operator renders; its Lease renewed with a long duration, so no renewal falls in the window).
2. Wait until every consumer is Ready, then a settling time (10 s; ``--quick``: 6 s).
3. Window (``--window`` seconds; default 60, ``--quick``: 6): count the requests the API server
   serves (the harness sends none then), the Events created, and the CPU time of the operator's
   thread.

Reported: API requests per consumer per minute, Events per hour (whole operator), the operator's CPU
per tick interval (all consumers), one consumer's whole pass (median and longest, wall time), and the
requests by verb and resource. Goals: at most 2 requests per consumer per minute and no Events at
steady state; a consumer's whole pass under 100 ms at 100 consumers.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime as dt
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import attrs
import kmock

from benchmarks._common import Column, Report, log, main
from multilane.operator.k8s.handlers import HandlerSettings, OperatorHandlers
from multilane.operator.k8s.kube import KubeClient, KubeSettings, api_path
from multilane.operator.k8s.platform import KubernetesPlatform
from multilane.operator.metrics import OperatorMetrics
from multilane.operator.sources import MetricSample, QueryContext
from multilane.operator.spec import children as ch
from multilane.operator.spec.children import ConsumerRef
from multilane.operator.spec.control_pki import ControlTlsSettings
from multilane.testing.fleet import WorkerFleetDouble
from multilane.testing.kopf_runner import OperatorRunner
from multilane.testing.kube_api import BUILTINS, ApiServerEmulator

CRD = Path(__file__).resolve().parents[1] / "crds" / "parallelconsumers.multilane.dev.yaml"
NS = "apiload"
TOKEN = "b" * 40
SIZES = (1, 10, 100)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--window", type=float, default=0.0, help="measured seconds per size (full 60)")
    parser.add_argument("--sizes", default="", help="comma-separated consumer counts (default 1,10,100)")


@attrs.define(kw_only=True)
class CountingApiServer(ApiServerEmulator):
    """The emulated API server, counting the requests it serves while ``counting`` is set."""

    counting: bool = attrs.field(default=False, init=False)
    counts: collections.Counter[str] = attrs.field(factory=collections.Counter, init=False)

    async def _handle(self, request: kmock.Request) -> Any:
        if self.counting:
            res = request.resource
            what = res.plural if res is not None else request.url.path
            sub = f"/{request.subresource}" if request.subresource else ""
            watch = " (watch)" if request.params.get("watch") in ("true", "1") else ""
            self.counts[f"{request.method.value} {what}{sub}{watch}"] += 1
        return await super()._handle(request)

    async def _serve_list(self, request: kmock.Request) -> Any:
        """kmock's list with a ``fieldSelector`` of ``a.b=value`` terms applied (as kube-apiserver
        does for Events' ``involvedObject.name`` and ``reason``), so that the operator's Event reads
        cost here what they cost on a cluster."""
        payload = await super()._serve_list(request)
        selector = request.params.get("fieldSelector") or ""
        terms = [t.split("=", 1) for t in selector.split(",") if "=" in t]
        if terms and isinstance(payload, dict):

            def value(obj: Any, path: str) -> Any:
                for part in path.split("."):
                    obj = obj.get(part) if isinstance(obj, dict) else None
                return obj

            payload["items"] = [
                i for i in payload.get("items") or [] if all(str(value(i, k)) == v for k, v in terms)
            ]
        return payload


class _Source:
    async def sample(self, ctx: QueryContext) -> MetricSample:
        return MetricSample(
            lag=dict.fromkeys(ctx.partitions, 0), input_rate=100.0, processing_rate=100.0, time=time.time()
        )


class _Admin:
    async def topic_partitions(self, topics: list[str]) -> dict[str, int]:
        return dict.fromkeys(topics, 4)


def _cr(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "multilane.dev/v1alpha1",
        "kind": "ParallelConsumer",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "kafka": {
                "bootstrapServers": "kafka:9092",
                "topics": [f"t-{name}"],
                "consumerGroup": f"g-{name}",
            },
            "workload": {"image": "example/app:1", "processor": "app:process"},
            "scaling": {"replicas": 1, "minReplicas": 1, "maxReplicas": 2, "intervalSeconds": 5},
        },
    }


def _thread_cpu_s(native_id: int | None) -> float:
    """CPU seconds (user + system) of one thread of this process, from /proc."""
    if native_id is None:
        return float("nan")
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _act_as_cluster(kube: KubeClient, names: list[str]) -> None:
    """Step 1's StatefulSet controller and workers, before the operator starts: per stored (defaulted)
    ParallelConsumer, the pod ``NAME-0`` its StatefulSet will have (labels and annotations of the
    template the operator renders, a Ready condition) and its Lease renewed with a long duration."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    for name in names:
        pc = await kube.get(api_path("multilane.dev/v1alpha1", "parallelconsumers", NS, name)) or {}
        ref = ConsumerRef(name, NS, str(pc["metadata"]["uid"]))
        meta = ch.stateful_set(ref, pc["spec"], 1)["spec"]["template"]["metadata"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}-0", **meta}}
        await kube.create(api_path("v1", "pods", NS), pod)
        ready = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        await kube.patch(api_path("v1", "pods", NS, f"{name}-0", "status"), {"status": ready})
        lease = ch.lease_manifest(ref, f"{name}-0")
        lease["spec"].update(renewTime=stamp, leaseDurationSeconds=3600)
        await kube.create(api_path("coordination.k8s.io/v1", "leases", NS), lease)


async def _all_ready(kube: KubeClient) -> int:
    ready = 0
    for pc in await kube.list(api_path("multilane.dev/v1alpha1", "parallelconsumers", NS)):
        for c in (pc.get("status") or {}).get("conditions") or []:
            ready += c.get("type") == "Ready" and c.get("status") == "True"
    return ready


async def _measure(consumers: int, window_s: float, settle_s: float = 10.0) -> dict[str, Any]:
    names = [f"c{i:03d}" for i in range(consumers)]
    fleet = WorkerFleetDouble([f"{n}-0" for n in names] + [f"{n}-1" for n in names])
    async with CountingApiServer() as emu, kmock.Server(emu):
        emu.load_crd(CRD)
        for gv, plural, kind, status in BUILTINS:
            emu.add_builtin(gv if "/" in gv else f"/{gv}", plural, kind, status=status)
        emu.add_builtin("/v1", "namespaces", "Namespace", namespaced=False)
        url = str(emu.url).rstrip("/")

        def handlers(kube: KubeClient) -> OperatorHandlers:
            return OperatorHandlers(
                kube,
                platform=KubernetesPlatform(kube, control_url=lambda ref, pod: f"fake://{pod}"),
                settings=HandlerSettings(tick_s=5.0, control_tls=ControlTlsSettings(enabled=False)),
                metrics=OperatorMetrics(),
                control_factory=lambda token: fleet,
                admin_factory=lambda config: _Admin(),  # type: ignore[arg-type, return-value]
                source_factory=lambda spec, config: _Source(),
                token_factory=lambda: TOKEN,
            )

        runner = OperatorRunner(url, handlers)
        async with KubeClient(KubeSettings(host=url), timeout_s=60.0) as kube:
            # 1. consumers, pods, leases; then the operator
            for name in names:
                await kube.create(api_path("multilane.dev/v1alpha1", "parallelconsumers", NS), _cr(name))
            await _act_as_cluster(kube, names)
            await runner.start()
            # 2. every consumer Ready, then settle
            deadline = time.monotonic() + 300
            while await _all_ready(kube) < consumers:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {await _all_ready(kube)} of {consumers} consumers Ready")
                await asyncio.sleep(1.0)
            await asyncio.sleep(settle_s)
            # 3. the window (every pass timed while counting)
            ops = runner.handlers
            assert ops is not None
            passes: list[float] = []
            inner = ops.control_pass._pass

            async def timed(ref: Any, fresh: Any) -> None:
                started = time.monotonic()
                try:
                    await inner(ref, fresh)
                finally:
                    if emu.counting:
                        passes.append(time.monotonic() - started)

            ops.control_pass._pass = timed  # type: ignore[method-assign]
            thread = runner._thread
            native = thread.native_id if isinstance(thread, threading.Thread) else None
            cpu0, started = _thread_cpu_s(native), time.monotonic()
            emu.counting = True
            await asyncio.sleep(window_s)
            emu.counting = False
            elapsed, cpu = time.monotonic() - started, _thread_cpu_s(native) - cpu0
            await runner.stop()
    counts = dict(emu.counts)
    total = sum(counts.values())
    events = sum(v for k, v in counts.items() if k.startswith("POST events"))
    return {
        "consumers": consumers,
        "window_s": elapsed,
        "requests": total,
        "per_consumer_min": total / consumers / (elapsed / 60.0),
        "events_per_hour": events * 3600.0 / elapsed,
        "pass_cpu_ms": cpu * 1000.0 / (elapsed / 5.0),
        "passes": len(passes),
        "pass_p50_ms": statistics.median(passes) * 1000.0 if passes else float("nan"),
        "pass_max_ms": max(passes) * 1000.0 if passes else float("nan"),
        "by_kind": ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "none",
    }


def body(args: argparse.Namespace, report: Report) -> None:
    window = args.window or (6.0 if args.quick else 60.0)
    sizes = tuple(int(s) for s in args.sizes.split(",") if s) or SIZES
    table = report.table(
        "steady",
        f"Operator load on the API server at steady state ({window:.0f} s window, tick 5 s)",
        [
            Column("consumers"),
            Column("requests", "requests in the window"),
            Column("per_consumer_min", "requests per consumer per minute", fmt=".2f"),
            Column("events_per_hour", "Events per hour", fmt=".0f"),
            Column("pass_cpu_ms", "operator CPU per tick interval (ms)", fmt=".1f"),
            Column("passes", "passes in the window"),
            Column("pass_p50_ms", "pass median (ms)", fmt=".1f"),
            Column("pass_max_ms", "longest pass (ms)", fmt=".1f"),
            Column("by_kind", "requests by verb and resource"),
        ],
    )
    table.note_key = "by_kind"  # a size that cannot be measured says why there
    rows: dict[int, dict[str, Any]] = {}
    for n in sizes:
        log(f"apiload: {n} consumers")
        try:
            rows[n] = asyncio.run(_measure(n, window, settle_s=6.0 if args.quick else 10.0))
        except Exception as exc:
            log(f"apiload: {n} consumers: {type(exc).__name__}: {exc}")
            table.add_unavailable(f"{type(exc).__name__}: {exc}", consumers=n)
            continue
        table.add(**{k: v for k, v in rows[n].items() if k != "window_s"})
    worst = max((r["per_consumer_min"] for r in rows.values()), default=None)
    report.goal("API requests per consumer per minute (worst size)", value=worst, target=2.0, op="<=")
    events = max((r["events_per_hour"] for r in rows.values()), default=None)
    report.goal("Events per hour at steady state (worst size)", value=events, target=0.0, op="<=")
    largest = rows.get(max(sizes)) if rows else None
    report.goal(
        f"longest pass of one consumer at {max(sizes)} consumers (ms)",
        value=largest["pass_max_ms"] if largest else None,
        target=100.0,
        op="<=",
    )
    report.note(
        "Requests counted at the emulated API server; the harness sends none in the window. Watches "
        "count when they (re)connect. The operator CPU is its kopf thread's (every consumer's pass, "
        "kopf's timers, the watches and the indexes) per 5 s tick interval; a pass is one consumer's "
        "timer handler, wall time (the passes of all consumers share one event loop)."
    )


if __name__ == "__main__":
    raise SystemExit(main("apiload", "API-server load of the operator at steady state.", body, add_arguments))
