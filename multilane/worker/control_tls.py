"""TLS for the worker's control endpoint: the server side (``multilane worker --control-tls-*``) with
client certificates required (mutual TLS), reloaded when the files change (rotation), and the
client side for the operator. Does I/O (reads certificate files).

Server (:class:`ControlTlsServer`): TLS 1.2+, the serving certificate and key from files, and client
certificates required and verified against ``client_ca`` (a client without a certificate signed by
it fails the handshake; plain HTTP on the port fails too, as it is not TLS). Rotation, in steps
(:meth:`ControlTlsServer.reload_if_changed`, called every ``interval_s`` by :meth:`run_reloader`):

1. Compare the files' modification times and sizes with those last loaded.
2. Changed: load the new certificate chain (and client CA) into the same ``SSLContext``; handshakes
   from then on use them, connections already open keep theirs. A half-written pair (the key does
   not match the certificate) is refused with a warning and the old pair stays; the next round
   tries again.

Client (:func:`client_context`): verifies the worker's certificate against the consumer's CA and
presents the operator's client certificate.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from dataclasses import dataclass

__all__ = ["ControlTlsFiles", "ControlTlsServer", "client_context"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ControlTlsFiles:
    cert: str  # PEM: the worker's serving certificate (chain)
    key: str  # PEM: its private key
    client_ca: str  # PEM: the CA whose client certificates may call (the operator's)


class ControlTlsServer:
    """The server ``SSLContext`` of the control endpoint, reloaded on change. Invariant: ``context``
    always holds a certificate and key that match (a failed reload keeps the old pair)."""

    def __init__(self, files: ControlTlsFiles) -> None:
        self.files = files
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.context.verify_mode = ssl.CERT_REQUIRED
        self.reloads = 0
        self._stamp: tuple[tuple[float, int], ...] | None = None
        if not self.reload_if_changed():
            raise ValueError(f"cannot load the control TLS files {files}")

    def _stamps(self) -> tuple[tuple[float, int], ...]:
        out = []
        for path in (self.files.cert, self.files.key, self.files.client_ca):
            st = os.stat(path)
            out.append((st.st_mtime, st.st_size))
        return tuple(out)

    def reload_if_changed(self) -> bool:
        """Steps 1-2. True when the files were (re)loaded now."""
        # 1. Changed?
        try:
            stamp = self._stamps()
        except OSError as exc:
            log.warning("control TLS: %s", exc)
            return False
        if stamp == self._stamp:
            return False
        # 2. Load into the same context (new handshakes use it).
        try:
            self.context.load_cert_chain(self.files.cert, self.files.key)
            self.context.load_verify_locations(cafile=self.files.client_ca)
        except (ssl.SSLError, OSError) as exc:
            log.warning("control TLS: not reloaded (%s); keeping the previous certificate", exc)
            return False
        self._stamp = stamp
        self.reloads += 1
        log.info("control TLS: certificate loaded from %s", self.files.cert)
        return True

    async def run_reloader(self, interval_s: float = 30.0) -> None:
        """Reload every ``interval_s`` when the files changed (until cancelled)."""
        while True:
            await asyncio.sleep(interval_s)
            self.reload_if_changed()


def client_context(ca_file: str, cert: str, key: str) -> ssl.SSLContext:
    """The operator's side: trust only ``ca_file`` (the consumer's CA) and present ``cert``/``key``."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    return ctx
