"""docs/runbook.md's commands that talk to a worker, run as written against a real worker endpoint.

- The breaker reset: the block's Python reads the Secrets ``NAME-control-tls`` (made here by the
  operator's own :class:`ControlCertManager`) and ``NAME-control-token`` (as the API server serves the
  operator's manifest), and calls ``POST /breaker/reset`` on a :class:`ControlServer` that demands
  mutual TLS and the token. Only the URL differs: ``localhost`` and a free port instead of the pod's
  DNS name and 8471 (the serving certificate here is signed by the Secret's CA for ``localhost``).
- The readiness read: the one-liner reads ``/readyz`` from ``$MULTILANE_POD_IP`` on the metrics port
  and prints a 503's body too (here 127.0.0.1 and a free port instead of 9464).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import sys
import textwrap
from pathlib import Path
from typing import Any, cast

import pytest
from aiohttp import web

from multilane.operator.k8s.certs import ControlCertManager, Pem
from multilane.operator.spec import control_pki as pki
from multilane.operator.spec.child_meta import ConsumerRef
from multilane.operator.spec.small_children import control_token_secret
from multilane.worker.control import ControlServer
from multilane.worker.control_tls import ControlTlsFiles, ControlTlsServer

pytestmark = pytest.mark.asyncio(loop_scope="function")

RUNBOOK = Path(__file__).resolve().parents[2] / "docs" / "runbook.md"
TOKEN = "t" * 40


def _blocks() -> list[str]:
    """The runbook's fenced bash blocks, dedented (list items indent them)."""
    text = RUNBOOK.read_text(encoding="utf-8")
    found = re.findall(r"^( *)```bash\n(.*?)^\1```", text, flags=re.S | re.M)
    out = []
    for indent, body in found:
        out.append(textwrap.dedent("\n".join(line[len(indent) :] for line in body.splitlines())))
    return out


def _python_of(needle: str) -> tuple[str, list[str]]:
    """The ``python -c '...' ARGS`` of the block containing ``needle``: (code, args)."""
    [block] = [b for b in _blocks() if needle in b]
    match = re.search(r"python -c '(.*?)'(.*)$", block, flags=re.S)
    assert match, block
    return match.group(1), match.group(2).split()


class _FakeKube:
    """What ControlCertManager.ensure needs of the API client: no Secret yet, then a create."""

    async def get(self, path: str) -> None:
        return None

    async def create(self, path: str, manifest: dict[str, Any]) -> dict[str, Any]:
        return manifest


class _Breaker:
    def __init__(self) -> None:
        self.open = True

    def reset(self) -> bool:
        was, self.open = self.open, False
        return was

    def status(self) -> dict[str, Any]:
        return {"open": self.open}


class _Supervisor:
    def __init__(self) -> None:
        self.breaker = _Breaker()


class _Engine:
    pass


async def _run(
    code: str, args: list[str], stdin: bytes, env: dict[str, str] | None = None
) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(stdin), timeout=60)
    return int(proc.returncode or 0), out.decode()


async def test_the_breaker_reset_block_calls_the_worker_over_mutual_tls(tmp_path: Path) -> None:
    code, args = _python_of("/breaker/reset")
    assert args == ["https://POD.NAME-workers.NS.svc:8471/breaker/reset"]
    ref = ConsumerRef(name="orders", namespace="apps", uid="u-1")
    manager = ControlCertManager(cast(Any, _FakeKube()), pki.ControlTlsSettings())
    tls_secret = await manager.ensure(ref)
    token_manifest = control_token_secret(ref, TOKEN)
    token_secret = {  # as the API server stores stringData
        **token_manifest,
        "data": {
            k: base64.b64encode(v.encode()).decode() for k, v in token_manifest.pop("stringData").items()
        },
    }
    listing = json.dumps({"kind": "List", "items": [tls_secret, token_secret]}).encode()
    # the worker side: a serving certificate for localhost from the Secret's CA, clients verified
    # against the Secret's trust bundle (the worker mounts ca.crt, tls.crt, tls.key)
    data = {k: base64.b64decode(v) for k, v in tls_secret["data"].items()}
    signer = Pem(data[pki.SIGNER_CERT], data[pki.SIGNER_KEY])
    serving = manager.issuer.leaf(signer, "test worker", ["localhost"], server=True, now=manager.clock())
    (tmp_path / "tls.crt").write_bytes(serving.cert)
    (tmp_path / "tls.key").write_bytes(serving.key)
    (tmp_path / "ca.crt").write_bytes(data[pki.TRUST_BUNDLE])
    tls = ControlTlsServer(ControlTlsFiles(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"),
                                           str(tmp_path / "ca.crt")))  # fmt: skip
    supervisor = _Supervisor()
    server = ControlServer(cast(Any, _Engine()), TOKEN, host="127.0.0.1", port=0, ssl_context=tls.context,
                           supervisor=cast(Any, supervisor))  # fmt: skip
    port = await server.start()
    # the block writes the operator's client key to a temporary file: the pod keeps none of it
    pod_tmp = tmp_path / "pod-tmp"
    pod_tmp.mkdir()
    env = {"TMPDIR": str(pod_tmp)}
    url = f"https://localhost:{port}/breaker/reset"
    try:
        rc, out = await _run(code, [url], listing, env)
        assert rc == 0, out
        assert json.loads(out) == {"was_open": True, "open": False}
        assert supervisor.breaker.open is False
        assert list(pod_tmp.iterdir()) == []
        # a wrong client key fails the call, and leaves nothing behind either
        wrong = json.loads(listing)
        other = manager.issuer.leaf(signer, "not the operator", [], server=False, now=manager.clock())
        wrong["items"][0]["data"][pki.CLIENT_KEY] = base64.b64encode(other.key).decode()
        rc, out = await _run(code, [url], json.dumps(wrong).encode(), env)
        assert rc != 0 and "SSLError" in out, out
        assert list(pod_tmp.iterdir()) == []
        # the same call without the client certificate is refused by the worker (mutual TLS)
        stripped = json.loads(listing)
        del stripped["items"][0]["data"][pki.CLIENT_CERT]
        rc, out = await _run(code, [url], json.dumps(stripped).encode(), env)
        assert rc != 0 and "client.crt" in out, out
        assert list(pod_tmp.iterdir()) == []
    finally:
        await server.stop()


async def test_the_readiness_one_liner_prints_a_503s_body() -> None:
    code, args = _python_of("/readyz")
    assert args == []

    async def readyz(_request: web.Request) -> web.Response:
        return web.json_response({"ready": False, "reasons": ["circuit breaker open: 5 dead letters"]},
                                 status=503)  # fmt: skip

    app = web.Application()
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        assert ":9464/readyz" in code
        rc, out = await _run(code.replace(":9464/", f":{port}/"), [], b"", {"MULTILANE_POD_IP": "127.0.0.1"})
        assert rc == 0, out
        assert out.startswith("503 ") and "circuit breaker open" in out, out
    finally:
        await runner.cleanup()
