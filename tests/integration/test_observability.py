"""The dashboard's queries and the alerts' expressions against a real Prometheus scraping real
components: ``multilane worker`` processes (state enabled) run by the local control plane, and the
control plane's operator metrics, under paced load on the embedded broker.

The load has a poison key (dead-lettered after its retries) and a slow key (stalled past the workers'
1 s stall threshold); half-way the test raises the pinned replica count from 1 to 2, so the operator
decides a scale-up and moves a partition with restore-before-handoff. Then every panel query of
charts/multilane/dashboards/multilane.json (Grafana variables filled in) and the decision annotation
must return series, every metric selector of every alert expression must match scraped series, and the
alert rules, loaded into that Prometheus, must evaluate without error. A metric snapshot of the same
endpoints is written and read back. The delivery checkers close the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import re
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from multilane.operator.local.plane import LocalControlPlane, LocalWorkerTemplate
from multilane.operator.rollout.handoff import HandoffConfig
from multilane.operator.spec.validation import validate_spec
from multilane.testing.broker import EmbeddedBroker
from multilane.testing.checkers import ProducedRecord, assert_all, check_delivery
from multilane.testing.loadgen import RateProfile, produce_paced
from multilane.testing.processors import read_event_log
from multilane.testing.prometheus import PrometheusServer, write_file_sd, write_metrics_snapshot

pytestmark = [pytest.mark.broker, pytest.mark.prometheus, pytest.mark.asyncio]

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "charts" / "multilane" / "dashboards" / "multilane.json"
RULES = REPO / "charts" / "multilane" / "alerts" / "multilane.rules.yaml"
PARTITIONS = 2
NAME = "obs"
POISON = b"key-000001"  # always raises: dead-lettered
SLOW = b"key-000002"  # 3 s per attempt: stalled past the 1 s threshold
SELECTOR_RE = re.compile(r"\b(multilane_[a-z_]+|up)\b(\{[^}]*\})?(?!\s*\()")


def panel_queries(dashboard: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in dashboard["panels"]:
        for t in p.get("targets", []):
            out[f"{p['title']} [{t['refId']}]"] = t["expr"]
    for a in dashboard["annotations"]["list"]:
        if a.get("expr"):
            out[f"annotation {a['name']}"] = a["expr"]
    return out


def fill(expr: str, topic: str) -> str:
    """Grafana's variables as a dashboard viewer on this consumer would have them."""
    values = {
        "$namespace": "local",
        "$consumer": NAME,
        "$topic": topic,
        "$__rate_interval": "2m",
        "$__interval": "5m",
    }
    for var, value in sorted(values.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(var, value)
    assert "$" not in expr, expr
    return expr


def alert_selectors(expr: str) -> set[str]:
    return {name + (matchers or "") for name, matchers in SELECTOR_RE.findall(expr)}


def values_of(result: list[dict[str, Any]]) -> list[float]:
    return [float(r["value"][1]) for r in result]


async def test_dashboard_and_alert_queries_return_series(
    broker: EmbeddedBroker, topic_name: str, tmp_path: Path
) -> None:
    broker.create_topic(topic_name, PARTITIONS)
    group = f"g-{uuid.uuid4().hex[:8]}"
    spec, problems = validate_spec(
        {
            "kafka": {"bootstrapServers": broker.bootstrap, "topics": [topic_name], "consumerGroup": group},
            "workload": {"image": "local", "processor": "multilane.testing.processors:logging_async"},
            "scaling": {
                "minReplicas": 1,
                "maxReplicas": 2,
                "replicas": 1,  # pinned; raised to 2 below (as `kubectl scale pcon` would)
                "minFactor": 2,
                "maxFactor": 2,
                "intervalSeconds": 1,
            },
        }
    )
    assert spec is not None, problems
    events = tmp_path / "events.log"
    template = LocalWorkerTemplate(
        broker.bootstrap,
        group,
        "multilane.testing.processors:logging_async",
        factor=2,
        drain_timeout_s=10.0,
        extra_args=("--max-retries", "1", "--retry-backoff-ms", "50", "--stall-threshold-s", "1"),
        env={
            "MULTILANE_TEST_LOG": str(events),
            "MULTILANE_TEST_SLEEP_MS": "2",
            "MULTILANE_TEST_POISON": POISON.decode(),
            "MULTILANE_TEST_SLOW_KEYS": SLOW.decode(),
            "MULTILANE_TEST_SLOW_MS": "3000",
        },
    )
    handoff = HandoffConfig(acceptable_recovery_lag=500, learner_timeout_s=20.0, release_deadline_s=10.0)
    partitions = [f"{topic_name}/{i}" for i in range(PARTITIONS)]
    cp = LocalControlPlane(
        tmp_path / "cp", spec, template, partitions, handoff, name=NAME, tick_s=0.3, metrics_port=0
    )
    sd_file = tmp_path / "workers.json"
    write_file_sd(sd_file, {})
    produced: list[ProducedRecord] = []
    prom: PrometheusServer | None = None
    try:
        await cp.start()
        assert cp.metrics_port
        prom = PrometheusServer(
            tmp_path / "prometheus",
            [
                {
                    "job_name": "multilane-workers",
                    "file_sd_configs": [{"files": [str(sd_file)], "refresh_interval": "1s"}],
                },
                {
                    # the operator's own labels (namespace, consumer) win, as with the chart's
                    # ServiceMonitor (honorLabels)
                    "job_name": "multilane-operator",
                    "honor_labels": True,
                    "static_configs": [{"targets": [f"127.0.0.1:{cp.metrics_port}"]}],
                },
            ],
            rule_files=[RULES],
        )
        await asyncio.to_thread(prom.start)

        def targets() -> dict[str, dict[str, str]]:
            return {
                f"127.0.0.1:{port}": {"namespace": "local", "consumer": NAME, "pod": worker}
                for worker, port in cp.platform.metrics_ports().items()
            }

        async def tick() -> None:
            await cp.tick()
            write_file_sd(sd_file, targets())

        def owners() -> dict[str, str]:
            members = (cp.status.get("assignment") or {}).get("members") or []
            return {p: m["worker"] for m in members for p in m["partitions"]}

        async def tick_until(cond: Any, limit_s: float, what: str) -> None:
            deadline = time.monotonic() + limit_s
            while not cond():
                assert time.monotonic() < deadline, f"{what} not reached in {limit_s:.0f}s: {cp.status}"
                await tick()
                await asyncio.sleep(0.3)

        await tick_until(lambda: len(owners()) == PARTITIONS, 60, "partitions placed on obs-0")

        # 1. load: 150 records/s for 24 s, 1000 uniform keys (poison and slow ones among them)
        def produce() -> None:
            result = produce_paced(
                broker.bootstrap, topic_name, RateProfile.constant(150, 24), keys=1000, zipf_s=0.0, seed=5
            )
            produced.extend(result.records)

        load = threading.Thread(target=produce, daemon=True)
        load.start()
        t0 = time.monotonic()
        await tick_until(lambda: time.monotonic() - t0 > 6, 30, "6 s of load")
        # 2. scale up: the decision, a new worker, a restore-before-handoff move
        cp.spec = dataclasses.replace(cp.spec, replicas=2)
        await tick_until(
            lambda: len(set(owners().values())) == 2 and not cp.status.get("rollout"), 90, "handoff to obs-1"
        )
        assert cp.executor is not None and cp.executor.completed, "no completed move"

        # 3. drain: the load produced and every partition committed to its end
        async def drained() -> bool:
            if load.is_alive():
                return False
            ends: dict[tuple[str, int], int] = {}
            for r in produced:
                ends[(r.topic, r.partition)] = max(ends.get((r.topic, r.partition), 0), r.offset + 1)
            committed: dict[tuple[str, int], int] = {}
            for st in (await cp.source.statuses()).values():
                for p in st.get("partitions") or []:
                    if p.get("committed") is not None and p.get("phase") == "active":
                        committed[(p["topic"], int(p["partition"]))] = int(p["committed"])
            return all(committed.get(tp, -1) >= end for tp, end in ends.items())

        deadline = time.monotonic() + 90
        while not await drained():
            assert time.monotonic() < deadline, f"not drained: {cp.status}"
            await tick()
            await asyncio.sleep(0.3)
        for _ in range(8):  # a few more scrapes of the final state (1 s interval)
            await tick()
            await asyncio.sleep(0.3)

        # 4. every dashboard query returns series
        dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
        empty, answers = [], {}
        for title, expr in panel_queries(dashboard).items():
            answers[title] = result = await asyncio.to_thread(prom.query, fill(expr, topic_name))
            if not result:
                empty.append(f"{title}: {fill(expr, topic_name)}")
        assert not empty, "dashboard queries without series:\n" + "\n".join(empty)
        # ... and the ones this run exercised show it
        assert max(values_of(answers["Input rate vs processing rate [A]"])) > 0
        assert max(values_of(answers["Dead-letter rate [A]"])) > 0
        assert max(values_of(answers["Handoff pause and move duration [C]"])) >= 1
        pause = values_of(answers["Handoff pause and move duration [A]"])
        assert all(math.isfinite(v) and v >= 0 for v in pause), pause
        commit = values_of(answers["Commit latency [A]"])
        assert all(math.isfinite(v) and v > 0 for v in commit), commit
        up = [r for r in answers["annotation Scaling decisions"] if r["metric"].get("direction") == "up"]
        assert up, answers["annotation Scaling decisions"]
        stalled = await asyncio.to_thread(
            prom.query, f'max_over_time(multilane_stalled_records{{consumer="{NAME}"}}[5m])'
        )
        assert max(values_of(stalled)) >= 1, "the slow key was never seen stalled"

        # 5. every metric an alert names is scraped, and the loaded rules evaluate cleanly
        rules = [r for g in yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"] for r in g["rules"]]
        missing = []
        for rule in rules:
            await asyncio.to_thread(prom.query, rule["expr"])  # valid PromQL against real data
            for selector in sorted(alert_selectors(rule["expr"])):
                if not await asyncio.to_thread(prom.query, f"count({selector})"):
                    missing.append(f"{rule['alert']}: {selector}")
        assert not missing, "alert selectors without series:\n" + "\n".join(missing)
        loaded = {r["name"]: r for g in await asyncio.to_thread(prom.rules) for r in g["rules"]}
        assert set(loaded) == {r["alert"] for r in rules}
        assert all(r["health"] == "ok" for r in loaded.values()), {
            n: r.get("lastError") for n, r in loaded.items() if r["health"] != "ok"
        }

        # 6. a snapshot of the same endpoints, read back
        endpoints = {f"http://{t}/metrics": labels for t, labels in targets().items()}
        endpoints[f"http://127.0.0.1:{cp.metrics_port}/metrics"] = {"job": "multilane-operator"}
        snapshot = tmp_path / "metrics.prom"
        written = await asyncio.to_thread(write_metrics_snapshot, snapshot, endpoints)
        families = {f.name: f for f in text_string_to_metric_families(snapshot.read_text())}
        assert written > 0
        assert [s.value for s in families["up"].samples] == [1.0] * len(endpoints)
        pods = {s.labels.get("pod") for s in families["multilane_consumer_lag"].samples}
        assert pods == set(cp.platform.metrics_ports())
        assert families["multilane_operator_scaling_decisions"].samples
    finally:
        with contextlib.suppress(Exception):
            await cp.close()
        for pid in cp.platform.workers().values():  # anything close() left running, by PID
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if prom is not None:
            prom.stop()

    # 7. delivery guarantees of the run (poison records were dead-lettered instead of ending)
    assert_all(check_delivery(produced, read_event_log(events), mode="key", exempt_keys=[POISON]))
    assert any(r.key == POISON for r in produced) and any(r.key == SLOW for r in produced)
