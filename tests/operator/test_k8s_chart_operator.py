"""chart-operator: the operator started exactly as the chart deploys it (values -> manifests ->
process), driving real pods through a stateful scale-up. A drift between the chart's Deployment
(args, env) and ``multilane operator``'s command line fails here.

The chart is rendered offline by helm-python-sdk; the operator container's ``args`` and ``env`` are
taken from the rendered Deployment, ``fieldRef`` env resolved as the kubelet would, the image's
``ENTRYPOINT ["multilane"]`` run as ``python -m multilane``, the ``/tmp`` emptyDir mapped to a
directory. Two things differ from a cluster, both set through the chart's own values: the ports
(``operator.healthPort``, ``metrics.port``: free loopback ports) and ``operator.extraEnv``
``MULTILANE_CONTROL_URL_TEMPLATE`` (the pod-network router of the StatefulSet double in place of the
headless Service's DNS). The API server is reached through a kubeconfig (``KUBECONFIG``), the
one substitution outside the chart: the emulator does not serve the in-cluster HTTPS endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from multilane.testing.broker import free_port
from tests.operator.conftest import OPERATOR_TOKEN
from tests.operator.k8s_harness import K8sHarness, k8s, wait_until

__all__ = ["k8s"]

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="function")]

CHART_DIR = Path(__file__).resolve().parents[2] / "charts" / "multilane"
DOCKERFILE = Path(__file__).resolve().parents[2] / "Dockerfile"


def rendered_operator(values: dict[str, Any]) -> dict[str, Any]:
    helm = pytest.importorskip("helm_python", reason="helm-python-sdk is not installed")
    chart = helm.Chart.load(str(CHART_DIR))
    out = chart.render(values, name="ml", namespace="multilane-system", is_install=True)
    for path, text in out.items():
        for doc in yaml.safe_load_all(text) if path.endswith((".yaml", ".yml")) else []:
            if doc and doc.get("kind") == "Deployment":
                return dict(doc)
    raise AssertionError("the chart renders no Deployment")


def process_of(deployment: dict[str, Any], tmp: Path) -> tuple[list[str], dict[str, str]]:
    """argv and env of the operator container, resolved as the kubelet would."""
    pod = deployment["spec"]["template"]
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "operator")
    entrypoint = [
        line for line in DOCKERFILE.read_text().splitlines() if line.startswith("ENTRYPOINT")
    ]
    assert set(entrypoint) == {'ENTRYPOINT ["multilane"]'}, entrypoint  # every target's (runtime, pipeline)
    assert "command" not in container, "the chart overrides the image's entrypoint"
    mounts = {m["mountPath"]: str(tmp / m["name"]) for m in container.get("volumeMounts") or []}
    for host in mounts.values():
        Path(host).mkdir(exist_ok=True)
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = mounts.get(str(item["value"]), str(item["value"]))
        else:
            field = item["valueFrom"]["fieldRef"]["fieldPath"]
            fields = {"metadata.name": "ml-multilane-0", "metadata.namespace": "multilane-system"}
            env[item["name"]] = fields[field]
    return [sys.executable, "-m", "multilane", *container["args"]], env


async def test_chart_rendered_operator_drives_a_stateful_scale_up(k8s: K8sHarness, tmp_path: Path) -> None:
    h = k8s
    health, metrics = free_port(), free_port()
    values = {
        "operator": {
            "healthPort": health,
            "extraEnv": [{"name": "MULTILANE_CONTROL_URL_TEMPLATE", "value": h.double.control_url_template}],
            # the pods' HTTP router speaks no TLS (test_control_tls_k8s.py runs mutual TLS)
            "extraArgs": ["--no-control-tls"],
        },
        "metrics": {"port": metrics},
    }
    argv, chart_env = process_of(rendered_operator(values), tmp_path)
    assert "operator" in argv and f"--metrics-port={metrics}" in argv, argv
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emu", "cluster": {"server": h.api_url}}],
                "users": [{"name": "emu", "user": {"token": OPERATOR_TOKEN}}],
                "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "emu"}}],
                "current-context": "emu",
            }
        )
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    log_path = tmp_path / "operator.log"
    with log_path.open("w") as log:
        proc = await asyncio.create_subprocess_exec(
            *argv, env={**base, **chart_env, "KUBECONFIG": str(kubeconfig)},
            stdout=log, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
    try:
        await h.create(h.body(replicas=1))
        try:
            await wait_until(lambda: h.balanced(1), 90, "every partition on orders-0", h)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\noperator log:\n{log_path.read_text()[-3000:]}") from None
        h.start_load(150, 10)
        await asyncio.sleep(2)
        await h.scale(2)
        await wait_until(lambda: h.balanced(2), 90, "2 pods with 2 partitions each", h)
        await wait_until(h.drained, 90, "every produced record committed", h)
        assert proc.returncode is None, "the operator exited"

        # the series the operator alerts read: this replica leads, the consumer is Ready
        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as answer:
                return str(answer.read().decode())

        async def alert_series() -> bool:
            text = await asyncio.to_thread(scrape)
            ready = (
                'multilane_consumer_condition{consumer="orders",namespace="team-a",status="True",type="Ready"}'
            )
            return "multilane_operator_leader 1.0" in text and f"{ready} 1.0" in text

        await wait_until(alert_series, 60, "multilane_operator_leader 1 and Ready=True on /metrics", h)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    await h.double.stop()
    v = h.assert_ok()
    records = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    assert records, "no JSON log lines (the chart's --log-format=json)"
    print(f"chart-operator: produced {v.produced}, replayed {v.replayed}")
