"""The ParallelConsumer resource as the kopf side sees it: its API names, the operator's settings,
kopf's own settings, each consumer's phase of the tick and the small readings of a body every part
makes (its reference, the pause annotation, an Event on it). Does I/O only in :func:`post_event`
(kopf posts the Event); the rest is pure.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from multilane.operator.k8s.kube import api_path
from multilane.operator.pass_model import EventRecord
from multilane.operator.spec import control_pki
from multilane.operator.spec.child_meta import ConsumerRef
from multilane.operator.spec.network import NetworkPolicySettings

__all__ = [
    "CR_API",
    "GROUP",
    "PAUSED_ANNOTATION",
    "PLURAL",
    "POLICY_STATE_ANNOTATION",
    "TRANSIENT_REASONS",
    "VERSION",
    "HandlerSettings",
    "configure_kopf",
    "consumer_ref",
    "cr_path",
    "is_paused",
    "post_event",
    "tick_phase",
]

GROUP = "multilane.dev"
VERSION = "v1alpha1"
PLURAL = "parallelconsumers"
CR_API = f"{GROUP}/{VERSION}"
PAUSED_ANNOTATION = "multilane.dev/paused"
POLICY_STATE_ANNOTATION = "multilane.dev/policy-state"
# Problems that can go away without a spec change: re-checked on every tick.
TRANSIENT_REASONS = frozenset({"KafkaUnreachable", "TopicNotFound", "CredentialsSecretMissing"})


@dataclass(frozen=True)
class HandlerSettings:
    tick_s: float = 5.0  # control-loop period; scaling decisions are further gated by intervalSeconds
    # Each consumer's pass runs at its own fixed phase of the tick, in [0, tick_spread * tick_s)
    # (tick_phase): kopf starts the timers of the consumers it finds together (at start-up, after a
    # leader change), and passes that all start at once queue on the one event loop. 0: no spread.
    tick_spread: float = 0.8
    kafka_timeout_s: float = 5.0
    release_deadline_s: float = 30.0
    worker_timeout_s: float = 10.0
    # Read spec.kafka.credentialsSecretRef for the operator's own Kafka admin calls (topic partitions,
    # lag). Off by default: whoever creates a ParallelConsumer names the Secret AND the
    # bootstrapServers, so reading it would send the Secret's credentials where the creator says (a
    # confused deputy). Workers get the Secret by envFrom from their own namespace either way.
    read_kafka_credentials: bool = False
    # The NetworkPolicy child NAME-workers (multilane/operator/spec/network.py); None: not created.
    network_policy: NetworkPolicySettings | None = field(default_factory=NetworkPolicySettings)
    secret_ttl_s: float = 300.0  # the credentials Secret is read again after this (and on reconcile)
    status_heartbeat_s: float = 60.0  # volatile status fields (lag, rates, policy) at least this often
    # mutual TLS on the workers' control port, its certificates and their rotation (k8s/certs.py)
    control_tls: control_pki.ControlTlsSettings = field(default_factory=control_pki.ControlTlsSettings)


def configure_kopf(settings: kopf.OperatorSettings) -> None:
    """kopf's own bookkeeping in annotations (the status schema is structural and would prune it);
    handler log lines become Events only from WARNING up (the operator posts its own Events); a
    stopped timer is noticed within a second (deletion)."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.posting.level = logging.WARNING
    settings.networking.request_timeout = 30
    settings.watching.server_timeout = 300
    # A deleted consumer's timer stops after its running pass; kopf checks whether it has exited every
    # cancellation_polling seconds (60 by default) and only then releases its finalizer, so a delete
    # waited up to a minute. Check every second.
    settings.background.cancellation_polling = 1.0


def tick_phase(uid: str, tick_s: float, spread: float) -> float:
    """The fixed delay of a consumer's pass after its timer fires: a point of ``[0, spread * tick_s)``
    given by the uid (CRC-32, the same in every operator replica and across restarts). Pure."""
    if spread <= 0 or not uid:
        return 0.0
    return zlib.crc32(uid.encode()) / 2**32 * min(spread, 1.0) * tick_s


def consumer_ref(body: Mapping[str, Any]) -> ConsumerRef:
    """The consumer a body names (name, namespace, uid)."""
    meta = body.get("metadata") or {}
    return ConsumerRef(name=str(meta["name"]), namespace=str(meta["namespace"]), uid=str(meta.get("uid", "")))


def cr_path(ref: ConsumerRef, subresource: str | None = None) -> str:
    """The API path of the ParallelConsumer (or of its ``status`` subresource)."""
    return api_path(CR_API, PLURAL, ref.namespace, ref.name, subresource)


def is_paused(body: Mapping[str, Any]) -> bool:
    """The annotation ``multilane.dev/paused: "true"`` holds every change."""
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(PAUSED_ANNOTATION, "")).lower() == "true"


def post_event(body: Mapping[str, Any], record: EventRecord) -> None:
    """A Kubernetes Event on the consumer (kopf posts it; its message cut to 1000 characters)."""
    # kopf accepts any mapping with apiVersion/kind/metadata; its annotation says Body.
    target: Any = dict(body)
    kopf.event(target, type=record.type, reason=record.reason, message=record.message[:1000])
