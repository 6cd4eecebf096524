"""``TlsFront``: TLS in front of a plain-HTTP server on loopback (the emulated API server), which a test
can cut and heal; and :func:`self_signed_cert` for it. Test support of
:class:`~multilane.testing.pods.StatefulSetProcessDouble` (a pod's path to the API server). Does I/O
(sockets, the ``openssl`` command, files).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
import time
from pathlib import Path

from multilane.testing.broker import free_port

__all__ = ["TlsFront", "self_signed_cert"]


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate (and key) for 127.0.0.1, made with the ``openssl`` command."""
    cert, key = directory / "apiserver.crt", directory / "apiserver.key"
    if not cert.exists():
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-keyout", str(key), "-out", str(cert), "-subj", "/CN=kubernetes",
             "-addext", "subjectAltName=IP:127.0.0.1"],
            check=True, capture_output=True,
        )  # fmt: skip
    return cert, key


class TlsFront:
    """TLS in front of the emulated API server (plain HTTP) on its own port; :meth:`cut` closes every
    connection and refuses new ones until :meth:`heal` (a network partition between a pod and the
    API server)."""

    def __init__(self, upstream_port: int, cert: Path, key: Path) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self.cut_since: float | None = None
        self._ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._ctx.load_cert_chain(str(cert), str(key))
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, ssl=self._ctx)

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    def cut(self) -> None:
        self.cut_since = time.monotonic()
        for w in list(self._writers):
            w.close()
        self._writers.clear()

    def heal(self) -> None:
        self.cut_since = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut_since is not None:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
                pass
            finally:
                dst.close()

        try:
            await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        finally:
            self._writers.discard(writer)
            self._writers.discard(up_writer)
