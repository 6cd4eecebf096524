"""Prometheus metrics of the operator itself. Does I/O only in :meth:`OperatorMetrics.serve` (HTTP).

Each :class:`OperatorMetrics` owns a registry, so several operators in one process (tests) do not
collide; the CLI serves it on ``--metrics-port``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

__all__ = ["OperatorMetrics"]


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.reconciles = Counter(
            "multilane_operator_reconciles_total",
            "Reconciliations of ParallelConsumer children, by result (applied, invalid, paused, error).",
            ["result"],
            registry=self.registry,
        )
        self.ticks = Counter(
            "multilane_operator_ticks_total",
            "Control-loop passes (scaling + assignment).",
            registry=self.registry,
        )
        self.decisions = Counter(
            "multilane_operator_decisions_total",
            "Autoscaling decisions, by whether they changed replicas or factor.",
            ["changed"],
            registry=self.registry,
        )
        self.errors = Counter(
            "multilane_operator_errors_total",
            "Errors by kind (metrics, kafka, kubernetes, worker, internal).",
            ["kind"],
            registry=self.registry,
        )
        self.replicas = Gauge(
            "multilane_operator_replicas",
            "Alive workers per consumer.",
            ["namespace", "name"],
            registry=self.registry,
        )
        self.factor = Gauge(
            "multilane_operator_factor",
            "Decided factor per consumer.",
            ["namespace", "name"],
            registry=self.registry,
        )
        self.assignment_generation = Gauge(
            "multilane_operator_assignment_generation",
            "Assignment generation in force per consumer.",
            ["namespace", "name"],
            registry=self.registry,
        )

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)

    def forget(self, namespace: str, name: str) -> None:
        for gauge in (self.replicas, self.factor, self.assignment_generation):
            try:
                gauge.remove(namespace, name)
            except KeyError:
                pass
