"""The workers' control port on mutual TLS, run by the operator (``multilane/operator/k8s/certs.py``,
``multilane/operator/spec/control_pki.py``): the real kopf operator creates the consumer's Secret
``orders-control-tls``, the pods (``multilane/testing/pods.py``, a real ``multilane worker`` each)
mount it and serve TLS with client certificates required, and the operator calls them by their DNS
names under the headless Service (resolved by the pod network's resolver), verifying them against the
consumer's CA and presenting its client certificate.

The scenario scales 1 -> 2 workers under load (restore-before-handoff through the control port) while
the certificates rotate every ~20 s (a 60 s lifetime, renewed at 30 %): every rotation step happens
(a next CA joins the bundle, the leaves switch to it, the old CA goes) and the workers reload the files
without a restart; the run ends with every delivery checker and the state equal to the reference.
Then the port refuses plain HTTP, a client without a certificate and a client whose certificate
another CA signed, and answers the operator's client.
"""

from __future__ import annotations

import base64
import ssl
import time
from typing import Any

import pytest

from multilane.operator.k8s.certs import CertIssuer
from multilane.operator.k8s.handlers import HandlerSettings
from multilane.operator.k8s.kube import api_path
from multilane.operator.k8s.platform import default_control_url
from multilane.operator.rollout.handoff import HandoffControlClient
from multilane.operator.rollout.workers import WorkerControlClient, WorkerUnreachableError
from multilane.operator.spec import control_pki as pki
from multilane.operator.spec.children import ConsumerRef
from tests.operator.conftest import NS
from tests.operator.k8s_harness import NAME, K8sHarness, k8s, wait_until  # noqa: F401 (k8s: the fixture)

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="function")]

TLS = pki.ControlTlsSettings(lifetime_s=60.0, renew_fraction=0.3, propagation_s=5.0)


async def _secret(h: K8sHarness) -> dict[str, bytes]:
    secret = await h.kube.get(api_path("v1", "secrets", NS, pki.tls_secret_name(NAME))) or {}
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def _context(trust: bytes, cert: bytes | None, key: bytes | None, tmp: Any) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=trust.decode())
    if cert is not None and key is not None:
        path = tmp / f"client-{time.monotonic_ns()}.pem"
        path.write_bytes(cert + key)
        ctx.load_cert_chain(str(path))
    return ctx


async def _committed(h: K8sHarness, ref: ConsumerRef, tmp: Any) -> dict[tuple[str, int], int]:
    """Committed offsets of the active partitions from the workers' /v1/status, over mutual TLS."""
    data = await _secret(h)
    ctx = _context(data[pki.TRUST_BUNDLE], data[pki.CLIENT_CERT], data[pki.CLIENT_KEY], tmp)
    client = WorkerControlClient(await h.token(), timeout_s=5, ssl_context=ctx, resolver=h.double.resolver())
    return await h.committed(client, lambda pod: default_control_url(ref, pod), skip=WorkerUnreachableError)


async def test_the_operator_runs_the_control_port_on_mutual_tls_and_rotates_it(
    k8s: K8sHarness,  # noqa: F811 (the fixture)
    tmp_path: Any,
) -> None:
    h = k8s
    settings = HandlerSettings(tick_s=0.5, kafka_timeout_s=3.0, release_deadline_s=10.0, control_tls=TLS)
    runner = h.make_operator(
        tick_s=0.5,
        control_url=default_control_url,  # the pods' DNS names, as in a cluster
        settings=settings,
        control_factory=lambda token: HandoffControlClient(token, resolver=h.double.resolver()),
    )
    h.double.secret_sync_s = 1.0
    body = h.body(replicas=1)
    body["spec"]["workload"]["env"].append({"name": "MULTILANE_CONTROL_TLS_RELOAD_S", "value": "1"})
    await runner.start()
    await h.create(body)
    obj = await h.kube.get(api_path("multilane.dev/v1alpha1", "parallelconsumers", NS, NAME)) or {}
    ref = ConsumerRef(NAME, NS, obj["metadata"]["uid"])

    # The Secret: owned by the consumer; the StatefulSet mounts its worker items and runs TLS.
    await wait_until(lambda: h.balanced(1), 120, "one worker owns every partition", h)
    secret = await h.kube.get(api_path("v1", "secrets", NS, pki.tls_secret_name(NAME))) or {}
    assert secret["metadata"]["ownerReferences"][0]["uid"] == ref.uid
    sts = await h.kube.get(api_path("apps/v1", "statefulsets", NS, NAME)) or {}
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert "--control-tls-client-ca" in container["args"]
    assert container["readinessProbe"]["httpGet"]["port"] == "metrics"

    # Under load, 1 -> 2 workers through restore-before-handoff, while the certificates rotate.
    h.start_load(rate=40, seconds=40)
    await h.scale(2)
    await wait_until(lambda: h.balanced(2), 120, "two workers share the partitions", h)
    handlers = runner.handlers
    assert handlers is not None

    def rotated() -> bool:
        steps = [s for _, s in handlers.certs.steps]
        return all(s in steps for s in ("add-next-ca", "switch-leaves", "drop-old-ca"))

    await wait_until(rotated, 90, "a whole rotation (next CA, new leaves, old CA dropped)", h)

    # Every worker reloaded the rotated files without a restart.
    for name, pod in h.double.pods.items():
        assert pod.restarts == 0, name
        assert h.double.logs(name).count("control TLS: certificate loaded") >= 2, name

    async def drained() -> bool:
        if not h.load_done():
            return False
        ends: dict[tuple[str, int], int] = {}
        for r in h.produced:
            ends[(r.topic, r.partition)] = max(ends.get((r.topic, r.partition), 0), r.offset + 1)
        committed = await _committed(h, ref, tmp_path)
        return all(committed.get(tp, -1) >= end for tp, end in ends.items())

    await wait_until(drained, 120, "every produced record committed (over mutual TLS)", h)
    assert (await h.status()).get("rollout") is None

    # The port refuses plain HTTP, no client certificate, and another CA's client certificate.
    data = await _secret(h)
    token = await h.token()
    url = default_control_url(ref, f"{NAME}-0")
    rogue_issuer = CertIssuer(3600.0)
    rogue_ca = rogue_issuer.ca("rogue", time.time())
    rogue = rogue_issuer.leaf(rogue_ca, "rogue", [], server=False, now=time.time())
    refused = {
        "plain HTTP": None,
        "no client certificate": _context(data[pki.TRUST_BUNDLE], None, None, tmp_path),
        "another CA's client": _context(data[pki.TRUST_BUNDLE], rogue.cert, rogue.key, tmp_path),
    }
    for what, ctx in refused.items():
        client = WorkerControlClient(token, timeout_s=5, ssl_context=ctx, resolver=h.double.resolver())
        try:
            with pytest.raises(WorkerUnreachableError):
                await client.status(url)
        finally:
            await client.close()
        assert what
    good = _context(data[pki.TRUST_BUNDLE], data[pki.CLIENT_CERT], data[pki.CLIENT_KEY], tmp_path)
    client = WorkerControlClient(token, timeout_s=5, ssl_context=good, resolver=h.double.resolver())
    try:
        assert (await client.status(url))["worker_id"] == f"{NAME}-0"
    finally:
        await client.close()

    await runner.stop()
    await h.double.stop()
    h.assert_ok()
