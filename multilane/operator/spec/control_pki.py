"""The control port's certificates of one ParallelConsumer: names, the Secret's layout, and when to
renew. Pure (no I/O, no cryptography: :mod:`multilane.operator.k8s.certs` issues the certificates and
writes the Secret).

Per consumer, one Secret ``NAME-control-tls`` in its namespace, owned by the ParallelConsumer (owner
reference, so it goes with it). Keys:

- ``ca.crt``: the trust bundle, one CA or two during a rotation (old and next). The workers verify the
  operator's client certificate against it; the operator verifies the workers' against it.
- ``tls.crt``/``tls.key``: the workers' serving certificate (every pod of the StatefulSet mounts the
  same one), DNS names ``*.NAME-workers.NAMESPACE.svc`` (+ ``.cluster.local``): how the operator reaches
  a pod (``POD.NAME-workers.NAMESPACE.svc``, the headless Service). No IP SAN: the pods share one
  Secret, and a pod's IP is known only once it runs.
- ``client.crt``/``client.key``: the operator's client certificate.
- ``signer.crt``/``signer.key``: the CA that signed the leaves (the operator's, never mounted);
  ``next.crt``/``next.key`` during a rotation.

The workers mount only ``ca.crt``, ``tls.crt`` and ``tls.key`` (:data:`WORKER_ITEMS`).

Rotation, in steps (:func:`plan_rotation`; the phase and its start are annotations on the Secret):

1. ``steady``, and ``renew_fraction`` of the leaves' lifetime passed (or they expired, or the Secret is
   unreadable): the next step is ``add-next-ca``: a new CA joins the bundle (``ca.crt`` = old + next);
   the leaves stay. Phase ``trusting-next``.
2. ``trusting-next`` for ``propagation_s`` (the kubelet updates a mounted Secret within about a
   minute and the worker reloads its TLS files every 30 s, ``multilane/worker/control_tls.py``): every
   worker trusts both CAs now. ``switch-leaves``: new serving and client certificates signed by the
   next CA, which becomes the signer. Both sides trust both CAs, so an operator with the new client
   certificate and a worker still serving the old one (or the reverse) still talk. Phase ``retiring``.
3. ``retiring`` for ``propagation_s``: every worker serves the new certificate. ``drop-old-ca``: the
   bundle keeps the signer only. Phase ``steady``.

Workers reload the files without a restart (no pod is rolled). A leaf that expired before step 1 ran
(an operator stopped for longer than the remaining third) is re-issued at once (``issue``): the calls
fail until the workers reloaded it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from multilane.operator.spec import children as ch

__all__ = [
    "CLIENT_CERT",
    "CLIENT_KEY",
    "NEXT_CERT",
    "NEXT_KEY",
    "PHASE_ANNOTATION",
    "SIGNER_CERT",
    "SIGNER_KEY",
    "SINCE_ANNOTATION",
    "TLS_DIR",
    "TRUST_BUNDLE",
    "WORKER_CERT",
    "WORKER_ITEMS",
    "WORKER_KEY",
    "ControlTlsSettings",
    "Phase",
    "PkiState",
    "RotationStep",
    "plan_rotation",
    "server_dns_names",
    "tls_secret",
    "tls_secret_name",
    "with_control_tls",
    "worker_tls_args",
]

TLS_DIR = "/etc/multilane/control-tls"  # where the workers mount the Secret's worker items
TRUST_BUNDLE = "ca.crt"
WORKER_CERT = "tls.crt"
WORKER_KEY = "tls.key"
CLIENT_CERT = "client.crt"
CLIENT_KEY = "client.key"
SIGNER_CERT = "signer.crt"
SIGNER_KEY = "signer.key"
NEXT_CERT = "next.crt"
NEXT_KEY = "next.key"
WORKER_ITEMS = (TRUST_BUNDLE, WORKER_CERT, WORKER_KEY)
PHASE_ANNOTATION = "multilane.dev/control-tls-phase"
SINCE_ANNOTATION = "multilane.dev/control-tls-since"  # unix seconds: when the phase began

Phase = Literal["steady", "trusting-next", "retiring"]
RotationStep = Literal["none", "issue", "add-next-ca", "switch-leaves", "drop-old-ca"]


@dataclass(frozen=True)
class ControlTlsSettings:
    """How the operator runs the control port's certificates (``multilane operator --control-tls-*``)."""

    enabled: bool = True  # False: plain HTTP + token (the chart's opt-out; the local platform always)
    lifetime_s: float = 90 * 86400.0  # of each CA and leaf
    renew_fraction: float = 2 / 3  # renew once this share of the lifetime passed
    propagation_s: float = 180.0  # a Secret change reaches every worker within this (kubelet + reload)

    def __post_init__(self) -> None:
        if not 0.0 < self.renew_fraction < 1.0:
            raise ValueError(f"renew_fraction must be in (0, 1), got {self.renew_fraction}")
        if self.lifetime_s <= 0 or self.propagation_s < 0:
            raise ValueError("lifetime_s must be > 0 and propagation_s >= 0")
        if self.lifetime_s * (1 - self.renew_fraction) <= 2 * self.propagation_s:
            raise ValueError("lifetime_s x (1 - renew_fraction) must exceed two propagation_s")


@dataclass(frozen=True)
class PkiState:
    """What the Secret says, read by :mod:`multilane.operator.k8s.certs`."""

    phase: Phase
    since: float  # unix seconds: when the phase began
    leaf_not_before: float  # unix seconds, of the serving certificate
    leaf_not_after: float


def plan_rotation(state: PkiState | None, now: float, settings: ControlTlsSettings) -> RotationStep:
    """The next step of the rotation (module docstring); ``None``: no (readable) Secret yet."""
    if state is None or now >= state.leaf_not_after:
        return "issue"
    # 1. Renewal due: a next CA joins the bundle.
    if state.phase == "steady":
        lifetime = state.leaf_not_after - state.leaf_not_before
        due = now >= state.leaf_not_before + settings.renew_fraction * lifetime
        return "add-next-ca" if due else "none"
    # 2. Every worker trusts the next CA: switch the leaves to it.
    if state.phase == "trusting-next":
        return "switch-leaves" if now >= state.since + settings.propagation_s else "none"
    # 3. Every worker serves the new leaf: the old CA leaves the bundle.
    return "drop-old-ca" if now >= state.since + settings.propagation_s else "none"


def tls_secret_name(name: str) -> str:
    return f"{name}-control-tls"


def server_dns_names(name: str, namespace: str) -> list[str]:
    """The serving certificate's DNS names: every pod under the headless Service ``NAME-workers``."""
    service = f"{name}-workers.{namespace}.svc"
    return [f"*.{service}", f"*.{service}.cluster.local", service]


def worker_tls_args() -> list[str]:
    """``multilane worker`` flags for the mounted Secret (``multilane/worker/control_tls.py``)."""
    return [
        "--control-tls-cert",
        f"{TLS_DIR}/{WORKER_CERT}",
        "--control-tls-key",
        f"{TLS_DIR}/{WORKER_KEY}",
        "--control-tls-client-ca",
        f"{TLS_DIR}/{TRUST_BUNDLE}",
    ]


def tls_secret(ref: ch.ConsumerRef, data: Mapping[str, str], phase: Phase, since: float) -> dict[str, Any]:
    """The Secret ``NAME-control-tls`` (``data``: base64 values by key), owned by the consumer."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": tls_secret_name(ref.name),
            "namespace": ref.namespace,
            "labels": {ch.CONSUMER_LABEL: ref.name, "app.kubernetes.io/component": "control-tls"},
            "annotations": {PHASE_ANNOTATION: phase, SINCE_ANNOTATION: f"{since:.0f}"},
            "ownerReferences": [ch.owner_reference(ref)],
        },
        "data": dict(data),
    }


def with_control_tls(ref: ch.ConsumerRef, sts: Mapping[str, Any]) -> dict[str, Any]:
    """The worker StatefulSet with the control port on mutual TLS: the Secret's worker items mounted
    at :data:`TLS_DIR`, the ``--control-tls-*`` flags, and the probes on the metrics port (the kubelet
    presents no client certificate; the worker answers ``/healthz`` and ``/readyz`` there too)."""
    out = copy.deepcopy(dict(sts))
    template = out["spec"]["template"]
    pod = template["spec"]
    container = pod["containers"][0]
    container["args"] = [*container["args"], *worker_tls_args()]
    container["volumeMounts"].append({"name": "control-tls", "mountPath": TLS_DIR, "readOnly": True})
    for probe in ("readinessProbe", "livenessProbe"):
        if probe in container:
            container[probe]["httpGet"]["port"] = "metrics"
    pod["volumes"].append(
        {
            "name": "control-tls",
            "secret": {
                "secretName": tls_secret_name(ref.name),
                "defaultMode": 0o440,
                "items": [{"key": key, "path": key} for key in WORKER_ITEMS],
            },
        }
    )
    ch.stamp_template_hash(template)
    return out
