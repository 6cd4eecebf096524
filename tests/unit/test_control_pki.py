"""The control port's certificates: the rotation plan (``multilane/operator/spec/control_pki.py``, pure)
and what ``multilane/operator/k8s/certs.py`` issues and reads back (SANs, usages, the state of a
Secret), plus the StatefulSet the operator renders with TLS on."""

from __future__ import annotations

import base64
import time

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from multilane.operator.k8s.certs import CertIssuer, read_state
from multilane.operator.spec import children as ch
from multilane.operator.spec import control_pki as pki

S = pki.ControlTlsSettings(lifetime_s=900.0, renew_fraction=2 / 3, propagation_s=60.0)
REF = ch.ConsumerRef("orders", "team-a", "uid-1")


def state(phase: str, since: float = 0.0) -> pki.PkiState:
    return pki.PkiState(phase=phase, since=since, leaf_not_before=0.0, leaf_not_after=900.0)  # type: ignore[arg-type]


def test_rotation_steps_in_order_and_only_when_due() -> None:
    assert pki.plan_rotation(None, 0.0, S) == "issue"
    assert pki.plan_rotation(state("steady"), 599.0, S) == "none"
    assert pki.plan_rotation(state("steady"), 600.0, S) == "add-next-ca"  # 2/3 of 900 s
    assert pki.plan_rotation(state("trusting-next", since=600.0), 659.0, S) == "none"
    assert pki.plan_rotation(state("trusting-next", since=600.0), 660.0, S) == "switch-leaves"
    assert pki.plan_rotation(state("retiring", since=660.0), 719.0, S) == "none"
    assert pki.plan_rotation(state("retiring", since=660.0), 720.0, S) == "drop-old-ca"
    assert pki.plan_rotation(state("trusting-next", since=600.0), 900.0, S) == "issue"  # expired


def test_settings_refuse_a_window_shorter_than_two_propagations() -> None:
    with pytest.raises(ValueError, match="propagation"):
        pki.ControlTlsSettings(lifetime_s=300.0, renew_fraction=0.9, propagation_s=60.0)
    with pytest.raises(ValueError, match="renew_fraction"):
        pki.ControlTlsSettings(renew_fraction=1.0)


def test_issued_certificates_name_the_pods_and_their_usage() -> None:
    issuer = CertIssuer(3600.0)
    now = time.time()
    ca = issuer.ca("ca", now)
    dns = pki.server_dns_names("orders", "team-a")
    server = x509.load_pem_x509_certificate(issuer.leaf(ca, "w", dns, server=True, now=now).cert)
    client = x509.load_pem_x509_certificate(issuer.leaf(ca, "op", [], server=False, now=now).cert)
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        "*.orders-workers.team-a.svc",
        "*.orders-workers.team-a.svc.cluster.local",
        "orders-workers.team-a.svc",
    ]
    usage = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    usage = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert server.issuer == x509.load_pem_x509_certificate(ca.cert).subject


def test_read_state_of_a_secret() -> None:
    issuer = CertIssuer(3600.0)
    now = time.time()
    ca = issuer.ca("ca", now)
    leaf = issuer.leaf(ca, "w", ["x.svc"], server=True, now=now)
    values = {
        pki.TRUST_BUNDLE: ca.cert, pki.WORKER_CERT: leaf.cert, pki.WORKER_KEY: leaf.key,
        pki.CLIENT_CERT: leaf.cert, pki.CLIENT_KEY: leaf.key,
        pki.SIGNER_CERT: ca.cert, pki.SIGNER_KEY: ca.key,
    }  # fmt: skip
    data = {k: base64.b64encode(v).decode() for k, v in values.items()}
    secret = pki.tls_secret(REF, data, "steady", now)
    got = read_state(secret)
    assert got is not None and got.phase == "steady"
    assert abs(got.leaf_not_before - now) < 2 and abs(got.leaf_not_after - (now + 3600)) < 2
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    # Missing keys or an unknown phase: unreadable, so the operator issues afresh.
    assert read_state(pki.tls_secret(REF, {pki.WORKER_CERT: data[pki.WORKER_CERT]}, "steady", now)) is None
    assert read_state({**secret, "metadata": {"annotations": {pki.PHASE_ANNOTATION: "x"}}}) is None
    assert read_state(None) is None


def test_the_statefulset_with_tls_mounts_only_the_worker_items_and_probes_the_metrics_port() -> None:
    spec = {
        "kafka": {"bootstrapServers": "k:9092", "topics": ["t"], "consumerGroup": "g"},
        "workload": {"image": "img", "processor": "m:f"},
    }
    plain = ch.stateful_set(REF, spec, 1)
    tls = pki.with_control_tls(REF, plain)
    pod = tls["spec"]["template"]["spec"]
    container = pod["containers"][0]
    i = container["args"].index("--control-tls-cert")
    assert container["args"][i : i + 6] == pki.worker_tls_args()
    volume = next(v for v in pod["volumes"] if v["name"] == "control-tls")
    assert volume["secret"]["secretName"] == "orders-control-tls"
    assert [item["key"] for item in volume["secret"]["items"]] == ["ca.crt", "tls.crt", "tls.key"]
    assert container["readinessProbe"]["httpGet"]["port"] == "metrics"
    assert container["livenessProbe"]["httpGet"]["port"] == "metrics"
    hash_of = ch.TEMPLATE_HASH_ANNOTATION
    assert tls["spec"]["template"]["metadata"]["annotations"][hash_of] != (
        plain["spec"]["template"]["metadata"]["annotations"][hash_of]
    )
    assert "--control-tls-cert" not in plain["spec"]["template"]["spec"]["containers"][0]["args"]
