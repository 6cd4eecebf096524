"""The certificates and keys of a loopback Kubernetes cluster (:mod:`multilane.testing.cluster`).
Does I/O (writes PEM files, mode 0600 for keys).

One CA signs everything: kube-apiserver's serving certificate (IP SANs 127.0.0.1 and the
``kubernetes`` Service's first address, the ``kubernetes.default.svc`` names) and the client
certificates, whose subject is the identity the API server authenticates (CN = user, O = groups):

| file | CN | O | used by |
|---|---|---|---|
| ``admin`` | ``multilane-admin`` | ``system:masters`` | kubectl, the tests' admin client |
| ``controller-manager`` | ``system:kube-controller-manager`` | | kube-controller-manager |
| ``scheduler`` | ``system:kube-scheduler`` | | the process kubelet's binder (no kube-scheduler runs) |
| ``node-NAME`` | ``system:node:NAME`` | ``system:nodes`` | the process kubelet (Node authorizer) |

The service-account signing key is a separate RSA key (``sa.key``/``sa.pub``).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["ClientCert", "ClusterPki"]

_LIFETIME = dt.timedelta(days=7)  # a test cluster lives for minutes; a week leaves room for `cluster up`


@dataclass(frozen=True)
class ClientCert:
    """A client certificate and its key, as files."""

    cert: Path
    key: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.touch(mode=0o600)
    path.write_bytes(data)


class ClusterPki:
    """The CA under ``dir`` and the certificates it issues (see the module docstring).

    Invariant: ``ca.crt``/``ca.key`` are written once, by the constructor; every certificate issued
    later is signed by that key.
    """

    def __init__(self, dir: Path, service_ip: str = "10.0.0.1") -> None:
        self.dir = dir
        self.service_ip = service_ip
        dir.mkdir(parents=True, exist_ok=True)
        self._now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)  # clock skew between processes
        self._ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "multilane-local-cluster-ca")])
        self._ca_name = name
        ca = (
            self._builder(name, self._ca_key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._ca_key, hashes.SHA256())
        )
        self.ca_cert = dir / "ca.crt"
        self.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        self.ca_key = dir / "ca.key"
        _write_key(self.ca_key, self._ca_key)
        # the service-account token signing key pair (kube-apiserver signs, verifies; kcm signs too)
        sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.sa_key = dir / "sa.key"
        _write_key(self.sa_key, sa)
        self.sa_pub = dir / "sa.pub"
        self.sa_pub.write_bytes(
            sa.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    def _builder(self, subject: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._ca_name)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._now)
            .not_valid_after(self._now + _LIFETIME)
        )

    def _issue(
        self, stem: str, subject: x509.Name, usage: x509.ObjectIdentifier, sans: list[x509.GeneralName]
    ) -> ClientCert:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            self._builder(subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        paths = ClientCert(self.dir / f"{stem}.crt", self.dir / f"{stem}.key")
        paths.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(paths.key, key)
        return paths

    def serving(self) -> ClientCert:
        """kube-apiserver's serving certificate (``apiserver.crt``/``.key``)."""
        dns = [
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ]
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", self.service_ip)]
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")])
        return self._issue("apiserver", subject, ExtendedKeyUsageOID.SERVER_AUTH, sans)

    def client(self, stem: str, user: str, groups: tuple[str, ...] = ()) -> ClientCert:
        """A client certificate for ``user`` in ``groups`` (files ``STEM.crt``/``STEM.key``)."""
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        subject = x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, user)])
        return self._issue(stem, subject, ExtendedKeyUsageOID.CLIENT_AUTH, [])
