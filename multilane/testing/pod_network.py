"""Two kubelet and cluster behaviours of :class:`~multilane.testing.pods.StatefulSetProcessDouble`
that TLS to the pods needs. Does I/O (files, the emulated API server).

- :class:`PodDnsResolver`: the headless Service's DNS names, ``POD.SERVICE.NAMESPACE.svc`` (and
  ``.svc.cluster.local``), resolved to 127.0.0.1 and the host port of the asked container port (the
  pods share the host's loopback). An aiohttp resolver: a client that connects through it keeps the
  DNS name for SNI and certificate verification, as in a cluster (the operator's
  ``WorkerControlClient(resolver=...)``).
- :class:`SecretVolume`: a mounted ``secret`` volume, written when the pod starts and again whenever the
  Secret changes (the kubelet refreshes a mounted Secret within about a minute; the double every
  ``StatefulSetProcessDouble.secret_sync_s``). Each file is replaced atomically (``os.replace``), as
  the kubelet's symlink swap does.
"""

from __future__ import annotations

import base64
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp.abc

from multilane.operator.k8s.kube import KubeClient, api_path

__all__ = ["PodDnsResolver", "SecretVolume", "secret_data"]


def secret_data(secret: dict[str, Any] | None) -> dict[str, bytes]:
    """A Secret's keys as the kubelet sees them: ``data`` (base64) merged with ``stringData`` (which a
    real API server folds into ``data``; the emulator may keep it as written)."""
    out = {k: base64.b64decode(v) for k, v in ((secret or {}).get("data") or {}).items()}
    out.update({k: str(v).encode() for k, v in ((secret or {}).get("stringData") or {}).items()})
    return out


class PodDnsResolver(aiohttp.abc.AbstractResolver):
    """``POD.<...>.svc[.cluster.local]`` -> 127.0.0.1 and ``host_port(POD, port)``; OSError (as a
    failed DNS lookup) for any other name, or a pod without a process's port."""

    def __init__(self, host_port: Callable[[str, int], int | None]) -> None:
        self.host_port = host_port

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[aiohttp.abc.ResolveResult]:
        name = host.rstrip(".")
        if not (name.endswith(".svc") or name.endswith(".svc.cluster.local")):
            raise OSError(f"pod network: no such host {host!r}")
        mapped = self.host_port(name.split(".", 1)[0], port)
        if mapped is None:
            raise OSError(f"pod network: no pod answers {host}:{port}")
        return [
            {
                "hostname": host,
                "host": "127.0.0.1",
                "port": mapped,
                "family": socket.AF_INET,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
        ]

    async def close(self) -> None:
        return None


@dataclass
class SecretVolume:
    """One mounted ``secret`` volume of one pod."""

    host: Path  # the directory standing for the mountPath
    namespace: str
    secret: str
    items: list[dict[str, Any]] | None  # the volume's ``items`` (None: every key)
    mode: int
    written: dict[str, bytes] = field(default_factory=dict)  # path -> content last written

    async def sync(self, kube: KubeClient) -> bool:
        """Write the Secret's items where they changed; True when a file changed."""
        secret = await kube.get(api_path("v1", "secrets", self.namespace, self.secret))
        data = secret_data(secret)
        items = self.items or [{"key": k, "path": k} for k in data]
        changed = False
        self.host.mkdir(parents=True, exist_ok=True)
        for item in items:
            content = data.get(item["key"], b"")
            if self.written.get(item["path"]) == content:
                continue
            target = self.host / item["path"]
            tmp = target.with_name(f".{target.name}.tmp")
            tmp.write_bytes(content)
            tmp.chmod(self.mode)
            os.replace(tmp, target)
            self.written[item["path"]] = content
            changed = True
        return changed
