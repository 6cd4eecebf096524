"""``multilane operator`` as a process: kubeconfig login, cluster-wide watching, JSON logs, liveness
endpoint, operator metrics. Against the emulated API server (multilane/testing/kube_api.py) and the
embedded broker; no workers (nothing to assign), so this checks the wiring, not the control loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from multilane.operator.k8s.kube import KubeClient, api_path
from multilane.testing.broker import EmbeddedBroker, free_port
from tests.operator.conftest import CR_COLLECTION, NS, OPERATOR_TOKEN, consumer_body
from tests.operator.doubles import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def http_get(url: str) -> tuple[int, str] | None:
    try:
        async with aiohttp.ClientSession() as s, s.get(url, timeout=aiohttp.ClientTimeout(total=3)) as r:
            return r.status, await r.text()
    except (aiohttp.ClientError, TimeoutError):
        return None


async def test_operator_command_runs_kopf_with_probes_metrics_and_json_logs(
    api: Any, kube: KubeClient, broker: EmbeddedBroker, topic: str, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emu", "cluster": {"server": api[1]}}],
                "users": [{"name": "emu", "user": {"token": OPERATOR_TOKEN}}],
                "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "emu"}}],
                "current-context": "emu",
            }
        )
    )
    liveness, metrics = free_port(), free_port()
    log_path = tmp_path / "operator.log"
    log = log_path.open("w")
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "multilane", "operator",
        "--liveness", f"http://127.0.0.1:{liveness}/healthz",
        "--metrics-port", str(metrics),
        "--tick-seconds", "1",
        stdout=log, stderr=asyncio.subprocess.STDOUT, env=env,
    )  # fmt: skip
    try:
        await kube.create(CR_COLLECTION, consumer_body("cli", broker.bootstrap, topic))
        await wait_for(
            lambda: kube.get(api_path("apps/v1", "statefulsets", NS, "cli")),
            timeout=90,
            what="sts from the CLI",
        )
        health = await wait_for(lambda: http_get(f"http://127.0.0.1:{liveness}/healthz"), what="liveness")
        assert health[0] == 200
        answer = await wait_for(lambda: http_get(f"http://127.0.0.1:{metrics}/metrics"), what="metrics")
        assert 'multilane_operator_reconciles_total{result="applied"}' in answer[1]
        assert "multilane_operator_ticks_total" in answer[1]
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        log.close()
    lines = [line for line in log_path.read_text().splitlines() if line.startswith("{")]
    records = [json.loads(line) for line in lines]
    assert records, log_path.read_text()[-2000:]
    assert all("message" in r and "timestamp" in r for r in records)
