"""``KubeClient``: a small asyncio client for the Kubernetes REST API. Does I/O (HTTP).

Only what the operator needs: get, list (with a label selector, re-checked on the client side), create,
merge-patch (also of ``/status``), update (PUT, with the ``resourceVersion`` of the body: 409 on a
conflict), delete (with DeleteOptions). Connection settings come from the ``kubernetes`` package's
config loaders (in-cluster service account, else kubeconfig) or are given explicitly (tests).

Tokens: with ``token_file`` (the projected service-account token in a pod) the bearer token is
re-read from the file every ``token_refresh_s`` (60 s, as client-go does: the kubelet rotates the
file well before the token expires) and at once after a 401, which is then retried once. So a rotated
or expired token is replaced without a restart.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

SA_TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"

__all__ = ["KubeClient", "KubeConflictError", "KubeError", "KubeNotFoundError", "KubeSettings", "api_path"]


class KubeError(RuntimeError):
    """The API server answered with an error (``status`` holds the HTTP code)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class KubeNotFoundError(KubeError):
    pass


class KubeConflictError(KubeError):
    pass


@dataclass(frozen=True)
class KubeSettings:
    """Where the API server is and how to authenticate. ``token`` may be empty (tests)."""

    host: str
    token: str = ""
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify_ssl: bool = True
    token_file: str | None = None  # re-read (see the module docstring); wins over ``token`` when set
    token_refresh_s: float = 60.0

    @classmethod
    def load(cls) -> KubeSettings:
        """In-cluster config if available, else the current kubeconfig context."""
        from kubernetes import client, config  # imported lazily: only the CLI path needs it

        cfg = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            config.load_kube_config(client_configuration=cfg)
        auth = (cfg.api_key or {}).get("authorization", "") or (cfg.api_key or {}).get("BearerToken", "")
        token = auth.split(" ", 1)[1] if auth.lower().startswith("bearer ") else auth
        in_cluster = Path(SA_TOKEN_FILE)
        return cls(
            token_file=str(in_cluster) if token and in_cluster.exists() else None,
            host=cfg.host,
            token=token,
            ca_file=cfg.ssl_ca_cert,
            cert_file=cfg.cert_file,
            key_file=cfg.key_file,
            verify_ssl=bool(cfg.verify_ssl),
        )


def api_path(
    api_version: str,
    plural: str,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    """``("apps/v1", "statefulsets", "ns", "x")`` -> ``/apis/apps/v1/namespaces/ns/statefulsets/x``."""
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = base + (f"/namespaces/{namespace}" if namespace else "") + f"/{plural}"
    if name:
        path += f"/{name}"
    if subresource:
        path += f"/{subresource}"
    return path


def _matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


class KubeClient:
    """Async REST calls with one shared session. Use ``async with`` or call :meth:`close`."""

    def __init__(self, settings: KubeSettings, timeout_s: float = 10.0) -> None:
        self.settings = settings
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._lock = asyncio.Lock()
        self._token = settings.token
        self._token_read_at: float | None = None  # monotonic time token_file was last read
        self.token_reads = 0  # how often token_file was read (tests)

    def _bearer(self, force: bool = False) -> str:
        """The current token: re-read from ``token_file`` when due (or ``force``)."""
        s = self.settings
        if s.token_file:
            now = time.monotonic()
            if force or self._token_read_at is None or now - self._token_read_at >= s.token_refresh_s:
                try:
                    self._token = Path(s.token_file).read_text().strip()
                    self.token_reads += 1
                except OSError:
                    pass  # keep the last token; the next call tries again
                self._token_read_at = now
        return self._token

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _get_session(self) -> aiohttp.ClientSession:
        async with self._lock:
            if self._session is None or self._session.closed:
                ssl_ctx: ssl.SSLContext | bool = False
                if self.settings.host.startswith("https"):
                    if self.settings.verify_ssl:
                        ctx = ssl.create_default_context(cafile=self.settings.ca_file)
                    else:
                        ctx = ssl.create_default_context()
                        ctx.check_hostname = False
                        ctx.verify_mode = ssl.CERT_NONE
                    if self.settings.cert_file:
                        ctx.load_cert_chain(self.settings.cert_file, self.settings.key_file)
                    ssl_ctx = ctx
                headers = {"Accept": "application/json"}
                self._session = aiohttp.ClientSession(
                    base_url=self.settings.host.rstrip("/") + "/",
                    headers=headers,
                    timeout=self._timeout,
                    connector=aiohttp.TCPConnector(ssl=ssl_ctx),
                )
            return self._session

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
    ) -> Any:
        session = await self._get_session()
        for attempt in (0, 1):
            headers: dict[str, str] = {}
            kwargs: dict[str, Any] = {"params": dict(params or {})}
            if body is not None:
                kwargs["json"] = body
                headers["Content-Type"] = content_type
            token = self._bearer(force=attempt == 1)
            if token:
                headers["Authorization"] = f"Bearer {token}"
            kwargs["headers"] = headers
            async with session.request(method, path.lstrip("/"), **kwargs) as resp:
                if resp.status == 401 and attempt == 0 and self.settings.token_file:
                    continue  # the token may have been rotated: re-read it and retry once
                return await self._answer(resp)
        raise AssertionError("unreachable")

    @staticmethod
    async def _answer(resp: aiohttp.ClientResponse) -> Any:
        if resp.status >= 400:
            text = await resp.text()
            err = {404: KubeNotFoundError, 409: KubeConflictError}.get(resp.status, KubeError)
            raise err(resp.status, text[:500])
        if resp.content_type == "application/json":
            return await resp.json()
        return None

    async def get(self, path: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            result = await self._request("GET", path)
        except KubeNotFoundError:
            return None
        return result if isinstance(result, dict) else None

    async def list(
        self, path: str, selector: Mapping[str, str] | None = None, fields: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """``selector``: labels (re-checked here); ``fields``: a field selector for the server (not
        re-checked: callers filter what they need)."""
        params = {"labelSelector": ",".join(f"{k}={v}" for k, v in selector.items())} if selector else {}
        if fields:
            params["fieldSelector"] = ",".join(f"{k}={v}" for k, v in fields.items())
        result = await self._request("GET", path, params=params or None)
        items = list((result or {}).get("items") or [])
        if selector:  # not every server filters (and it costs nothing to be sure)
            items = [i for i in items if _matches((i.get("metadata") or {}).get("labels") or {}, selector)]
        return items

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create; raises :class:`KubeConflictError` when it exists."""
        result = await self._request("POST", path, body=dict(body))
        return result if isinstance(result, dict) else dict(body)

    async def patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """JSON merge-patch (``application/merge-patch+json``)."""
        merge = "application/merge-patch+json"
        result = await self._request("PATCH", path, body=dict(body), content_type=merge)
        return result if isinstance(result, dict) else {}

    async def update(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Replace (PUT); the body's ``metadata.resourceVersion`` makes it conditional (409 when the
        object changed since it was read: re-read, never overwrite)."""
        result = await self._request("PUT", path, body=dict(body))
        return result if isinstance(result, dict) else {}

    async def delete(self, path: str, options: Mapping[str, Any] | None = None) -> bool:
        """Delete (``options``: DeleteOptions, e.g. ``propagationPolicy``, ``preconditions``); False when
        it did not exist."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", **options} if options else None
        try:
            await self._request("DELETE", path, body=body)
        except KubeNotFoundError:
            return False
        return True
