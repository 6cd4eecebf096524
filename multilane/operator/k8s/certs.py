"""The control port's certificates on Kubernetes: issues them (``cryptography``), keeps them in each
consumer's Secret ``NAME-control-tls``, rotates them (the steps of
:mod:`multilane.operator.spec.control_pki`) and gives the operator's worker-control client its TLS
context. Does I/O (Kubernetes API; the ``ssl`` module loads the client key from a private temporary
file, removed at once).

:meth:`ControlCertManager.ensure`, in steps (on reconcile, and on every control pass while a step is
due by the state last read, so a steady pass costs no request):

1. Read the Secret (a GET) and its state (phase, when it began, the serving certificate's validity).
2. :func:`~multilane.operator.spec.control_pki.plan_rotation` names the step; ``none``: done.
3. Write the step: create the Secret (``issue`` when it is missing), or merge-patch it carrying the
   ``resourceVersion`` read in step 1. A 409 (another writer changed or created it since: a previous
   leader, a racing replica) is never overwritten: back to step 1 (at most three rounds; then the
   next pass tries again).

The CA keys stay in the Secret (only the operator reads them: the pods mount the three worker items).
Who may read Secrets in a consumer's namespace may therefore call its workers as the operator, as with
the control token.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from multilane.operator.k8s.kube import KubeClient, KubeConflictError, api_path
from multilane.operator.spec import control_pki as pki
from multilane.operator.spec.children import ConsumerRef

__all__ = ["CLOCK_SKEW_S", "CertIssuer", "ControlCertManager", "Pem", "read_state"]

log = logging.getLogger(__name__)

CLOCK_SKEW_S = 60.0  # certificates are valid from this long before they are issued (nodes' clocks)


@dataclass(frozen=True)
class Pem:
    cert: bytes
    key: bytes


class CertIssuer:
    """EC P-256 keys, SHA-256 signatures; validity from ``now`` (minus a minute of clock skew) for
    ``lifetime_s``. Pure computation (no I/O)."""

    def __init__(self, lifetime_s: float) -> None:
        self.lifetime_s = lifetime_s

    def _window(self, now: float) -> tuple[dt.datetime, dt.datetime]:
        start = dt.datetime.fromtimestamp(now, dt.UTC)
        return start - dt.timedelta(seconds=CLOCK_SKEW_S), start + dt.timedelta(seconds=self.lifetime_s)

    @staticmethod
    def _pem(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Pem:
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return Pem(cert.public_bytes(serialization.Encoding.PEM), key_pem)

    def ca(self, common_name: str, now: float) -> Pem:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        start, end = self._window(now)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        return self._pem(cert, key)

    def leaf(self, ca: Pem, common_name: str, dns_names: list[str], *, server: bool, now: float) -> Pem:
        ca_cert = x509.load_pem_x509_certificate(ca.cert)
        ca_key = cast(ec.EllipticCurvePrivateKey, serialization.load_pem_private_key(ca.key, None))
        key = ec.generate_private_key(ec.SECP256R1())
        start, end = self._window(now)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(min(end, ca_cert.not_valid_after_utc))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
                critical=False,
            )
        )
        if dns_names:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), critical=False
            )
        return self._pem(builder.sign(ca_key, hashes.SHA256()), key)


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def _data(secret: Mapping[str, Any] | None) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in ((secret or {}).get("data") or {}).items()}


def read_state(secret: Mapping[str, Any] | None) -> pki.PkiState | None:
    """The rotation state of a Secret; None when it is missing or unreadable (then: issue afresh)."""
    if secret is None:
        return None
    data = _data(secret)
    annotations = (secret.get("metadata") or {}).get("annotations") or {}
    try:
        phase = str(annotations.get(pki.PHASE_ANNOTATION, ""))
        if phase not in ("steady", "trusting-next", "retiring"):
            return None
        for key in (*pki.WORKER_ITEMS, pki.CLIENT_CERT, pki.CLIENT_KEY, pki.SIGNER_CERT, pki.SIGNER_KEY):
            if not data.get(key):
                return None
        if phase == "trusting-next" and not (data.get(pki.NEXT_CERT) and data.get(pki.NEXT_KEY)):
            return None
        leaf = x509.load_pem_x509_certificate(data[pki.WORKER_CERT])
        return pki.PkiState(
            phase=cast(pki.Phase, phase),
            since=float(annotations.get(pki.SINCE_ANNOTATION, "0")),
            leaf_not_before=leaf.not_valid_before_utc.timestamp() + CLOCK_SKEW_S,  # when issued
            leaf_not_after=leaf.not_valid_after_utc.timestamp(),
        )
    except ValueError:
        return None


class ControlCertManager:
    """The certificates of every consumer this operator handles. Invariant: ``_secrets[uid]`` is the
    Secret as this operator last read or wrote it (written by :meth:`ensure` only)."""

    def __init__(
        self,
        kube: KubeClient,
        settings: pki.ControlTlsSettings,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.clock = clock
        self.issuer = CertIssuer(settings.lifetime_s)
        self._secrets: dict[str, dict[str, Any]] = {}
        self._contexts: dict[str, tuple[str, ssl.SSLContext]] = {}  # uid -> (resourceVersion, context)
        self.steps: list[tuple[str, str]] = []  # (consumer, step) written, oldest first (tests, logs)

    def forget(self, uid: str) -> None:
        self._secrets.pop(uid, None)
        self._contexts.pop(uid, None)

    def _path(self, ref: ConsumerRef, name: bool = True) -> str:
        return api_path("v1", "secrets", ref.namespace, pki.tls_secret_name(ref.name) if name else None)

    def due(self, ref: ConsumerRef) -> bool:
        """A step is due by the Secret last read (no request)."""
        cached = self._secrets.get(ref.uid)
        return pki.plan_rotation(read_state(cached), self.clock(), self.settings) != "none"

    async def ensure(self, ref: ConsumerRef, *, fresh: bool = True) -> dict[str, Any]:
        """Steps 1-3 of the module docstring; returns the Secret. ``fresh=False``: no request unless a
        step is due by the Secret last read."""
        if not fresh and ref.uid in self._secrets and not self.due(ref):
            return self._secrets[ref.uid]
        for _ in range(3):
            # 1. Read.
            secret = await self.kube.get(self._path(ref))
            now = self.clock()
            # 2. Plan.
            step = pki.plan_rotation(read_state(secret), now, self.settings)
            if step == "none":
                assert secret is not None
                self._secrets[ref.uid] = secret
                return secret
            # 3. Write, conditional on what step 1 read.
            try:
                written = await self._write(ref, secret, step, now)
            except KubeConflictError:
                log.info("%s/%s: control TLS Secret changed meanwhile; re-reading", ref.namespace, ref.name)
                continue
            self._secrets[ref.uid] = written
            self.steps.append((f"{ref.namespace}/{ref.name}", step))
            log.info("%s/%s: control TLS: %s", ref.namespace, ref.name, step)
            return written
        raise KubeConflictError(409, f"control TLS Secret of {ref.namespace}/{ref.name} kept changing")

    async def _write(
        self, ref: ConsumerRef, secret: Mapping[str, Any] | None, step: str, now: float
    ) -> dict[str, Any]:
        old = _data(secret)
        label = f"{ref.namespace}/{ref.name}"
        dns = pki.server_dns_names(ref.name, ref.namespace)
        data: dict[str, bytes | None]
        phase: pki.Phase
        if step == "issue":
            ca = self.issuer.ca(f"multilane control CA {label}", now)
            data = self._leaves(ca, label, dns, now)
            data.update({pki.TRUST_BUNDLE: ca.cert, pki.SIGNER_CERT: ca.cert, pki.SIGNER_KEY: ca.key})
            data.update({pki.NEXT_CERT: None, pki.NEXT_KEY: None})
            phase = "steady"
        elif step == "add-next-ca":
            nxt = self.issuer.ca(f"multilane control CA {label} {int(now)}", now)
            bundle = old[pki.SIGNER_CERT] + nxt.cert
            data = {pki.TRUST_BUNDLE: bundle, pki.NEXT_CERT: nxt.cert, pki.NEXT_KEY: nxt.key}
            phase = "trusting-next"
        elif step == "switch-leaves":
            nxt = Pem(old[pki.NEXT_CERT], old[pki.NEXT_KEY])
            data = self._leaves(nxt, label, dns, now)
            data.update({pki.SIGNER_CERT: nxt.cert, pki.SIGNER_KEY: nxt.key, pki.NEXT_CERT: None})
            data[pki.NEXT_KEY] = None
            phase = "retiring"
        else:  # drop-old-ca
            data = {pki.TRUST_BUNDLE: old[pki.SIGNER_CERT]}
            phase = "steady"
        encoded = {k: (None if v is None else _b64(v)) for k, v in data.items()}
        if secret is None:
            manifest = pki.tls_secret(ref, {k: v for k, v in encoded.items() if v is not None}, phase, now)
            return await self.kube.create(self._path(ref, name=False), manifest)
        meta = secret.get("metadata") or {}
        patch = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": {pki.PHASE_ANNOTATION: phase, pki.SINCE_ANNOTATION: f"{now:.0f}"},
            },
            "data": encoded,
        }
        return await self.kube.patch(self._path(ref), patch)

    def _leaves(self, ca: Pem, label: str, dns: list[str], now: float) -> dict[str, bytes | None]:
        server = self.issuer.leaf(ca, f"multilane workers {label}", dns, server=True, now=now)
        client = self.issuer.leaf(ca, "multilane-operator", [], server=False, now=now)
        return {
            pki.WORKER_CERT: server.cert,
            pki.WORKER_KEY: server.key,
            pki.CLIENT_CERT: client.cert,
            pki.CLIENT_KEY: client.key,
        }

    def client_context(self, ref: ConsumerRef) -> ssl.SSLContext | None:
        """The operator's side, from the Secret last read: trust the bundle (old and next CA during a
        rotation), present the client certificate. The same object while the Secret is unchanged."""
        secret = self._secrets.get(ref.uid)
        if secret is None:
            return None
        rv = str((secret.get("metadata") or {}).get("resourceVersion") or "")
        cached = self._contexts.get(ref.uid)
        if cached is not None and cached[0] == rv:
            return cached[1]
        data = _data(secret)
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=data[pki.TRUST_BUNDLE].decode())
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        with tempfile.TemporaryDirectory(prefix="multilane-tls-") as d:
            path = os.path.join(d, "client.pem")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data[pki.CLIENT_CERT] + data[pki.CLIENT_KEY])
            ctx.load_cert_chain(path)
        self._contexts[ref.uid] = (rv, ctx)
        return ctx

    async def wire(self, ref: ConsumerRef, control: Any) -> None:
        """Before a control pass: the due rotation step (no request otherwise), then the current context
        onto ``control`` (a :class:`~multilane.operator.rollout.workers.WorkerControlClient`; other
        controls, such as the tests' in-memory fleets, have no ``use_tls`` and are left alone)."""
        await self.ensure(ref, fresh=False)
        use_tls = getattr(control, "use_tls", None)
        ctx = self.client_context(ref)
        if use_tls is not None and ctx is not None:
            use_tls(ctx)
