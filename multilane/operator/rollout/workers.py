"""``WorkerControlClient``: the operator's side of the worker control API. Does I/O (HTTP).

Implements the calls of docs/architecture.md "Worker control API" with ``Authorization: Bearer``.
Errors are mapped to two exceptions the assignment protocol acts on: :class:`WorkerFencedError` (409: the
worker has seen a higher generation) and :class:`WorkerUnreachableError` (anything else).
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import aiohttp.abc

from multilane.formats.handover import Handover, encode_handovers
from multilane.operator.decision.planner import format_partition, parse_partition

__all__ = [
    "ReleasedPartition",
    "WorkerControlClient",
    "WorkerError",
    "WorkerFencedError",
    "WorkerUnreachableError",
]


class WorkerError(RuntimeError):
    """A control call did not succeed."""


class WorkerUnreachableError(WorkerError):
    """Connection failure, timeout, or an unexpected HTTP answer."""


class WorkerFencedError(WorkerError):
    """The worker refused the call's generation (HTTP 409): it has seen a higher one."""


@dataclass(frozen=True, slots=True)
class ReleasedPartition:
    partition: str  # "topic/index"
    committed_offset: int | None  # None: nothing was ever committed for it
    progress: str | None = None  # the progress record of that commit (base64, opaque here), if known
    changelog_end: int | None = None  # where the partition's changelog ended then (with ``progress``)

    @property
    def handover(self) -> Handover | None:
        """What this release hands the partition's next owner (None: no progress record to hand)."""
        return None if self.progress is None else Handover(self.progress, self.changelog_end)


def _partitions_body(partitions: Iterable[str]) -> list[dict[str, Any]]:
    body = []
    for p in partitions:
        topic, index = parse_partition(p)
        body.append({"topic": topic, "partition": index})
    return body


def _released(items: Any) -> list[ReleasedPartition]:
    out = []
    try:
        for item in items or []:
            offset = item.get("committed_offset")
            progress = item.get("progress")
            end = item.get("changelog_end")
            out.append(
                ReleasedPartition(
                    partition=format_partition(str(item["topic"]), int(item["partition"])),
                    committed_offset=None if offset is None else int(offset),
                    progress=progress if isinstance(progress, str) else None,
                    changelog_end=None if end is None else int(end),
                )
            )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise WorkerUnreachableError(f"malformed 'released' in answer: {items!r}") from exc
    return out


class WorkerControlClient:
    """One client for all workers of the operator; ``token`` is the consumer's control token."""

    def __init__(
        self,
        token: str,
        timeout_s: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
        resolver: aiohttp.abc.AbstractResolver | None = None,
    ) -> None:
        self._token = token
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        # TLS to the workers (multilane.worker.control_tls.client_context, or the consumer's Secret:
        # multilane.operator.k8s.certs): the consumer's CA and the operator's client certificate; None:
        # plain HTTP
        self._ssl = ssl_context
        # name resolution (None: the system's); the tests' pod network maps the pods' DNS names
        self._resolver = resolver
        self._session: aiohttp.ClientSession | None = None
        self._stale_session: aiohttp.ClientSession | None = None  # closed by the next call

    async def close(self) -> None:
        if self._stale_session is not None:
            await self._stale_session.close()
            self._stale_session = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def use_tls(self, ssl_context: ssl.SSLContext) -> None:
        """Call the workers over TLS with ``ssl_context`` from now on (``http://`` worker URLs are
        called as ``https://``); a new context (a rotation) takes effect on the next call, through a
        new session (connections of the old one close)."""
        if ssl_context is not self._ssl:
            self._ssl = ssl_context
            self._stale_session, self._session = self._session, None

    async def call(self, method: str, url: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        if self._stale_session is not None:
            stale, self._stale_session = self._stale_session, None
            await stale.close()
        if self._ssl is not None and url.startswith("http://"):
            url = "https://" + url[len("http://") :]
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                headers={"Authorization": f"Bearer {self._token}"},
                connector=aiohttp.TCPConnector(
                    ssl=self._ssl if self._ssl is not None else True, resolver=self._resolver
                ),
            )
        try:
            async with self._session.request(method, url, json=body) as resp:
                if resp.status == 409:
                    raise WorkerFencedError(f"{url}: {await resp.text()}")
                if resp.status != 200:
                    raise WorkerUnreachableError(f"{url}: HTTP {resp.status}: {(await resp.text())[:200]}")
                data = await resp.json()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise WorkerUnreachableError(f"{url}: {type(exc).__name__}: {exc}") from exc
        if not isinstance(data, dict):
            raise WorkerUnreachableError(f"{url}: answer is not a JSON object")
        return data

    async def status(self, base_url: str) -> dict[str, Any]:
        return await self.call("GET", f"{base_url}/v1/status")

    async def assign(
        self,
        base_url: str,
        generation: int,
        partitions: Iterable[str],
        release_deadline_s: float,
        handovers: Mapping[str, Handover] | None = None,
    ) -> list[ReleasedPartition]:
        """Push the worker's whole assignment; returns what it released (with final committed offsets
        and progress records). ``handovers``: partition -> what its last owner released (the worker
        uses it for a partition it adds instead of reading the progress topic), on the wire by
        :func:`~multilane.formats.handover.encode_handovers`."""
        body: dict[str, Any] = {
            "generation": generation,
            "partitions": _partitions_body(partitions),
            "release_deadline_s": release_deadline_s,
        }
        if handovers:
            body["progress"] = encode_handovers({parse_partition(p): h for p, h in handovers.items()})
        data = await self.call("POST", f"{base_url}/v1/assignment", body)
        return _released(data.get("released"))

    async def set_factor(self, base_url: str, factor: int) -> int:
        data = await self.call("POST", f"{base_url}/v1/factor", {"factor": factor})
        return int(data.get("factor", factor))

    async def pause(self, base_url: str) -> bool:
        return bool((await self.call("POST", f"{base_url}/v1/pause")).get("paused"))

    async def resume(self, base_url: str) -> bool:
        return bool((await self.call("POST", f"{base_url}/v1/resume")).get("paused"))
