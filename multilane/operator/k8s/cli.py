"""``multilane operator``: run the kopf operator. Does I/O (Kubernetes API, HTTP servers).

Cluster-wide by default (every namespace; ``--namespace`` narrows it). With more than one replica,
pass ``--leader-election``: every replica runs a :class:`~multilane.operator.k8s.leader.LeaseElector`
on the Lease ``--leader-election-name`` in its own namespace (``POD_NAMESPACE``), only the leader runs
kopf, a standby serves the liveness endpoint while it waits, and a replica that loses the Lease exits
(exit code 3; the kubelet restarts it as a standby). kopf's own peering (``--peering``) remains for
setups without Leases. Logs are JSON lines; a liveness endpoint and a Prometheus metrics port are
served.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Any

from multilane.operator.k8s.handlers import HandlerSettings, OperatorHandlers, configure_kopf
from multilane.operator.k8s.kube import KubeClient, KubeSettings
from multilane.operator.metrics import OperatorMetrics
from multilane.operator.spec.control_pki import ControlTlsSettings
from multilane.operator.spec.network import NetworkPolicySettings, parse_labels

__all__ = ["add_arguments", "kopf_login", "run"]


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
        "--leader-election",
        action="store_true",
        help="run kopf only while holding the Lease --leader-election-name (for more than one replica)",
    )
    parser.add_argument("--leader-election-name", default="multilane-operator", help="name of the Lease")
    parser.add_argument(
        "--leader-election-namespace",
        default="",
        help="namespace of the Lease (default: $POD_NAMESPACE)",
    )
    parser.add_argument(
        "--lease-duration", type=float, default=15.0, help="leader Lease duration (s): a standby takes over"
        " at most this long (plus --retry-period) after the leader's last renewal",
    )  # fmt: skip
    parser.add_argument("--renew-deadline", type=float, default=10.0, help="leader gives up after (s)")
    parser.add_argument("--retry-period", type=float, default=2.0, help="election round period (s)")
    parser.add_argument(
        "--liveness",
        default="http://0.0.0.0:8080/healthz",
        help="liveness endpoint URL served by kopf ('' to disable)",
    )
    parser.add_argument(
        "--metrics-port", type=int, default=9465, help="operator Prometheus metrics port (0: off)"
    )
    parser.add_argument(
        "--metrics-address",
        default="0.0.0.0",
        help="address the metrics port binds (a pod IP where pods share the host's network)",
    )
    parser.add_argument("--tick-seconds", type=float, default=5.0, help="control-loop period")
    parser.add_argument("--kafka-timeout", type=float, default=5.0, help="Kafka admin call timeout (s)")
    parser.add_argument(
        "--release-deadline",
        type=float,
        default=30.0,
        help="how long a worker may take to release partitions",
    )
    parser.add_argument(
        "--read-kafka-credentials",
        action="store_true",
        help="read spec.kafka.credentialsSecretRef for the operator's own Kafka calls (default: no;"
        " see docs/security.md, confused deputy)",
    )
    parser.add_argument(
        "--no-worker-network-policy",
        action="store_true",
        help="do not create the NetworkPolicy child NAME-workers of each ParallelConsumer",
    )
    parser.add_argument(
        "--operator-namespace",
        default=os.environ.get("POD_NAMESPACE", ""),
        help="namespace of the operator pods, admitted to the workers' control port (default:"
        " $POD_NAMESPACE; empty: any namespace, with --operator-pod-labels)",
    )
    parser.add_argument(
        "--operator-pod-labels",
        default="app.kubernetes.io/component=operator,app.kubernetes.io/part-of=multilane",
        help="labels (K=V,...) of the operator pods, admitted to the workers' control port",
    )
    parser.add_argument(
        "--monitoring-namespace-labels",
        default="kubernetes.io/metadata.name=monitoring",
        help="labels (K=V,...) of the namespaces admitted to the workers' metrics port",
    )
    parser.add_argument(
        "--monitoring-pod-labels",
        default="",
        help="labels (K=V,...) of the pods admitted there (default: any)",
    )
    parser.add_argument(
        "--no-control-tls", dest="control_tls", action="store_false",
        help="call the workers' control port over plain HTTP + token (default: mutual TLS, certificates"
        " in each consumer's Secret NAME-control-tls, rotated; docs/security.md)",
    )  # fmt: skip
    parser.add_argument(
        "--control-tls-lifetime-days", type=float, default=90.0, help="lifetime of the control certificates"
    )
    parser.add_argument(
        "--control-tls-renew-fraction", type=float, default=2 / 3,
        help="renew the control certificates once this share of their lifetime passed (default 2/3)",
    )  # fmt: skip
    parser.add_argument("--log-format", choices=["json", "plain", "full"], default="json")
    parser.add_argument("--verbose", action="store_true")


LOST_LEADERSHIP_EXIT = 3


def network_policy_settings(args: argparse.Namespace) -> NetworkPolicySettings | None:
    """The NetworkPolicy child's peers from the command line (None with --no-worker-network-policy)."""
    if args.no_worker_network_policy:
        return None
    return NetworkPolicySettings(
        operator_namespace=args.operator_namespace or None,
        operator_pod_labels=parse_labels(args.operator_pod_labels),
        monitoring_namespace_labels=parse_labels(args.monitoring_namespace_labels),
        monitoring_pod_labels=parse_labels(args.monitoring_pod_labels),
    )


async def _standby_health(liveness: str) -> Any:
    """A /healthz answering 200 while this replica waits for the Lease (kopf serves it once leading).
    Returns the aiohttp runner (``await runner.cleanup()`` to stop), or None without liveness."""
    if not liveness:
        return None
    from urllib.parse import urlparse

    from aiohttp import web

    url = urlparse(liveness)

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"standby": True})

    app = web.Application()
    app.router.add_get(url.path or "/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, url.hostname or "0.0.0.0", url.port or 8080).start()
    return runner


def kopf_login(**kwargs: Any) -> Any:
    """kopf's login handler (an explicit registry has no default one): like kopf's default, the
    kubernetes client's in-cluster config, else the kubeconfig, read again on every call. kopf calls it
    again after a 401, so a rotated token (the projected token file, a kubeconfig ``tokenFile``)
    is picked up without a restart (``tests/operator/test_tokens.py``)."""
    import kopf

    return kopf.login_via_client(**kwargs)


async def _main(args: argparse.Namespace) -> int:
    import kopf

    settings = HandlerSettings(
        tick_s=args.tick_seconds,
        kafka_timeout_s=args.kafka_timeout,
        release_deadline_s=args.release_deadline,
        read_kafka_credentials=args.read_kafka_credentials,
        network_policy=network_policy_settings(args),
        control_tls=ControlTlsSettings(
            enabled=args.control_tls,
            lifetime_s=args.control_tls_lifetime_days * 86400.0,
            renew_fraction=args.control_tls_renew_fraction,
        ),
    )
    metrics = OperatorMetrics()
    if args.metrics_port:
        metrics.serve(args.metrics_port, addr=args.metrics_address)
    async with KubeClient(KubeSettings.load()) as kube:
        registry = kopf.OperatorRegistry()

        kopf.on.login(registry=registry)(kopf_login)
        OperatorHandlers(kube, settings=settings, metrics=metrics).register(registry)
        kopf_settings = kopf.OperatorSettings()
        configure_kopf(kopf_settings)

        async def operate() -> None:
            metrics.set_leader(True)  # multilane_operator_leader: the alerts' "no operator leads"
            try:
                await run_kopf()
            finally:
                metrics.set_leader(False)

        async def run_kopf() -> None:
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

        if not args.leader_election:
            await operate()
            return 0
        return await _lead(args, kube, operate)


async def _lead(args: argparse.Namespace, kube: KubeClient, operate: Any) -> int:
    """Standby (serving liveness) until this replica holds the Lease, then ``operate()``; exit code
    :data:`LOST_LEADERSHIP_EXIT` when the Lease is lost."""
    import os

    from multilane.operator.k8s.leader import LeaderLostError, LeaseElector, LeaseElectorSettings

    elector = LeaseElector(
        kube,
        LeaseElectorSettings(
            namespace=args.leader_election_namespace or os.environ.get("POD_NAMESPACE", "default"),
            name=args.leader_election_name,
            identity=os.environ.get("POD_ID") or os.environ.get("HOSTNAME") or "",
            lease_duration_s=args.lease_duration,
            renew_deadline_s=args.renew_deadline,
            retry_period_s=args.retry_period,
        ),
    )
    health = [await _standby_health(args.liveness)]

    async def stop_health() -> None:
        if health[0] is not None:
            runner, health[0] = health[0], None
            await runner.cleanup()

    async def leading() -> None:
        await stop_health()  # kopf serves liveness from now on
        await operate()

    try:
        await elector.run(leading)
    except LeaderLostError as exc:
        logging.getLogger("multilane").error("lost the leader Lease (%s): exiting", exc)
        return LOST_LEADERSHIP_EXIT
    finally:
        await stop_health()
    return 0


def run(args: argparse.Namespace) -> int:
    import kopf

    log_format = {"json": kopf.LogFormat.JSON, "plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL}
    kopf.configure(verbose=args.verbose, log_format=log_format[args.log_format])
    logging.getLogger("multilane").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    try:
        network_policy_settings(args)  # bad labels: one line, before anything starts
    except ValueError as exc:
        print(f"multilane operator: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_main(args))
    except KeyboardInterrupt:
        return 130
