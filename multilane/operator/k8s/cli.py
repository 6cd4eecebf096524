"""``multilane operator``: run the kopf operator. Does I/O (Kubernetes API, HTTP servers).

Cluster-wide by default (every namespace; ``--namespace`` narrows it). One replica runs standalone;
with more replicas, pass ``--peering NAME`` so that kopf's peering (a ``ClusterKopfPeering`` object of
that name, installed by the chart) keeps exactly one active. Logs are JSON lines; a liveness endpoint
and a Prometheus metrics port are served.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any

from multilane.operator.k8s.handlers import HandlerSettings, OperatorHandlers, configure_kopf
from multilane.operator.k8s.kube import KubeClient, KubeSettings
from multilane.operator.metrics import OperatorMetrics

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="watch only this namespace (repeatable; glob patterns allowed); default: all namespaces",
    )
    parser.add_argument(
        "--peering",
        default="",
        metavar="NAME",
        help="kopf peering object name, for more than one operator replica (default: standalone)",
    )
    parser.add_argument("--priority", type=int, default=0, help="peering priority of this replica")
    parser.add_argument(
        "--liveness",
        default="http://0.0.0.0:8080/healthz",
        help="liveness endpoint URL served by kopf ('' to disable)",
    )
    parser.add_argument(
        "--metrics-port", type=int, default=9465, help="operator Prometheus metrics port (0: off)"
    )
    parser.add_argument("--tick-seconds", type=float, default=5.0, help="control-loop period")
    parser.add_argument("--kafka-timeout", type=float, default=5.0, help="Kafka admin call timeout (s)")
    parser.add_argument(
        "--release-deadline",
        type=float,
        default=30.0,
        help="how long a worker may take to release partitions",
    )
    parser.add_argument("--log-format", choices=["json", "plain", "full"], default="json")
    parser.add_argument("--verbose", action="store_true")


async def _main(args: argparse.Namespace) -> None:
    import kopf

    settings = HandlerSettings(
        tick_s=args.tick_seconds,
        kafka_timeout_s=args.kafka_timeout,
        release_deadline_s=args.release_deadline,
    )
    metrics = OperatorMetrics()
    if args.metrics_port:
        metrics.serve(args.metrics_port)
    async with KubeClient(KubeSettings.load()) as kube:
        registry = kopf.OperatorRegistry()

        # An explicit registry has no default login handlers: log in like kopf's default does
        # (the kubernetes client's in-cluster config, else the kubeconfig).
        @kopf.on.login(registry=registry)
        def _login(**kwargs: Any) -> kopf.ConnectionInfo | None:
            info: kopf.ConnectionInfo | None = kopf.login_via_client(**kwargs)
            return info

        OperatorHandlers(kube, settings=settings, metrics=metrics).register(registry)
        kopf_settings = kopf.OperatorSettings()
        configure_kopf(kopf_settings)
        await kopf.operator(
            registry=registry,
            settings=kopf_settings,
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            standalone=not args.peering,
            peering_name=args.peering or None,
            priority=args.priority,
            liveness_endpoint=args.liveness or None,
        )


def run(args: argparse.Namespace) -> int:
    import kopf

    log_format = {"json": kopf.LogFormat.JSON, "plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL}
    kopf.configure(verbose=args.verbose, log_format=log_format[args.log_format])
    logging.getLogger("multilane").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    try:
        asyncio.run(_main(args))
    except KeyboardInterrupt:
        return 130
    return 0
