"""The worker's control port with TLS (``multilane/worker/control_tls.py``): it refuses plain HTTP, a
client without a certificate and a client whose certificate another CA signed; the operator's client
(``WorkerControlClient`` with :func:`client_context`) verifies the worker against the consumer's CA
and gets through; a rotated serving certificate is picked up without a restart.

Certificates come from the ``openssl`` command (a CA per test, EC P-256 keys). The engine is a stub:
TLS and authentication happen before any engine call."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest

from multilane.operator.rollout.workers import WorkerControlClient, WorkerUnreachableError
from multilane.worker.control import ControlServer
from multilane.worker.control_tls import ControlTlsFiles, ControlTlsServer, client_context

pytestmark = pytest.mark.asyncio(loop_scope="function")

TOKEN = "c" * 40


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(d: Path, name: str) -> tuple[Path, Path]:
    cert, key = d / f"{name}.crt", d / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name}")  # fmt: skip
    return cert, key


def issue(d: Path, ca: tuple[Path, Path], name: str, ext: str) -> tuple[Path, Path]:
    cert, key, csr, extfile = d / f"{name}.crt", d / f"{name}.key", d / f"{name}.csr", d / f"{name}.ext"
    extfile.write_text(ext + "\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}")  # fmt: skip
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
             "-out", str(cert), "-days", "2", "-extfile", str(extfile))  # fmt: skip
    return cert, key


class _StubEngine:
    async def refresh_learners(self) -> None:
        return None

    def status(self) -> dict[str, Any]:
        return {"worker_id": "w-0", "partitions": []}


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Any]:
    ca = make_ca(tmp_path, "consumer-ca")
    server = issue(tmp_path, ca, "worker", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth")
    client = issue(tmp_path, ca, "operator", "extendedKeyUsage=clientAuth")
    rogue_ca = make_ca(tmp_path, "rogue-ca")
    rogue = issue(tmp_path, rogue_ca, "rogue", "extendedKeyUsage=clientAuth")
    return {"dir": tmp_path, "ca": ca, "server": server, "client": client, "rogue": rogue}


async def _serve(pki: dict[str, Any]) -> tuple[ControlServer, ControlTlsServer, str]:
    tls = ControlTlsServer(ControlTlsFiles(str(pki["server"][0]), str(pki["server"][1]), str(pki["ca"][0])))
    server = ControlServer(cast(Any, _StubEngine()), TOKEN, host="127.0.0.1", port=0, ssl_context=tls.context)
    port = await server.start()
    return server, tls, f"https://127.0.0.1:{port}"


async def _fails(url: str, ssl_arg: Any) -> bool:
    try:
        async with (
            aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as s,
            s.get(url + "/v1/status", ssl=ssl_arg, timeout=aiohttp.ClientTimeout(total=5)) as r,
        ):
            return r.status != 200
    except (TimeoutError, aiohttp.ClientError, ssl.SSLError, ConnectionError):
        return True


async def test_refuses_plain_http_and_unknown_clients(pki: dict[str, Any]) -> None:
    server, _, url = await _serve(pki)
    try:
        plain = url.replace("https://", "http://")
        assert await _fails(plain, None), "plain HTTP answered"
        verify_only = ssl.create_default_context(cafile=str(pki["ca"][0]))
        assert await _fails(url, verify_only), "a client without a certificate got through"
        rogue = client_context(str(pki["ca"][0]), str(pki["rogue"][0]), str(pki["rogue"][1]))
        assert await _fails(url, rogue), "a client certificate of another CA got through"
        # The operator's client: verifies the worker, presents its certificate, sends the token.
        good = client_context(str(pki["ca"][0]), str(pki["client"][0]), str(pki["client"][1]))
        client = WorkerControlClient(TOKEN, timeout_s=5, ssl_context=good)
        try:
            assert (await client.status(url))["worker_id"] == "w-0"
        finally:
            await client.close()
        # The token is still checked behind TLS.
        wrong_token = WorkerControlClient("x" * 40, timeout_s=5, ssl_context=good)
        try:
            with pytest.raises(WorkerUnreachableError, match="401"):
                await wrong_token.status(url)
        finally:
            await wrong_token.close()
    finally:
        await server.stop()


async def test_the_operator_refuses_a_worker_its_ca_did_not_sign(pki: dict[str, Any]) -> None:
    server, _, url = await _serve(pki)
    try:
        # An operator that trusts another consumer's CA (the rogue one) refuses this worker.
        wrong_ca = client_context(str(pki["rogue"][0]), str(pki["client"][0]), str(pki["client"][1]))
        client = WorkerControlClient(TOKEN, timeout_s=5, ssl_context=wrong_ca)
        try:
            with pytest.raises(WorkerUnreachableError):
                await client.status(url)
        finally:
            await client.close()
    finally:
        await server.stop()


def _serial(url: str, ctx: ssl.SSLContext) -> str:
    import socket

    host, port = url.removeprefix("https://").split(":")
    with (
        socket.create_connection((host, int(port)), timeout=5) as sock,
        ctx.wrap_socket(sock, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return ssl.DER_cert_to_PEM_cert(der)


async def test_a_rotated_certificate_is_used_without_a_restart(pki: dict[str, Any]) -> None:
    server, tls, url = await _serve(pki)
    try:
        ctx = client_context(str(pki["ca"][0]), str(pki["client"][0]), str(pki["client"][1]))
        before = await asyncio.to_thread(_serial, url, ctx)
        assert not tls.reload_if_changed()  # nothing changed
        # The operator re-issues the serving certificate; the kubelet updates the mounted files.
        issue(pki["dir"], pki["ca"], "worker", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth")
        assert tls.reload_if_changed() and tls.reloads == 2
        after = await asyncio.to_thread(_serial, url, ctx)
        assert after != before
        # A half-written pair (key of another certificate) is refused; the served one stays.
        pki["server"][1].write_bytes(pki["client"][1].read_bytes())
        assert not tls.reload_if_changed()
        assert await asyncio.to_thread(_serial, url, ctx) == after
    finally:
        await server.stop()
