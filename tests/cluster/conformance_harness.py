"""The conformance test's harness: the API-server double served in a thread of its own, one request
sent to a server (the double, or the real kube-apiserver as its administrator), and the rows' types.
Test support; does I/O (HTTP, a thread with an event loop)."""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multilane.testing.kube_api import ApiServerEmulator, emulated_api_server

__all__ = ["JSON_PATCH", "MERGE", "Answer", "Body", "Req", "Row", "Target", "served_double"]

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"

#: A body, or a function of the target's context (the answers saved by earlier steps of the row).
Body = Mapping[str, Any] | list[Any] | Callable[[dict[str, Any]], Any] | None


@dataclass(frozen=True)
class Answer:
    """What is compared: the HTTP code and the ``Status`` reason (empty on success), plus
    ``projection`` of the answer when the step asks for one."""

    code: int
    reason: str
    projection: Any = None
    body: Any = field(default=None, compare=False)


@dataclass(frozen=True)
class Req:
    """One request. ``save``: the answer's object is kept in the context under this key (later steps'
    bodies read it, e.g. its ``resourceVersion`` or ``uid``). ``project``: a part of the answer that
    must be the same on both servers (defaulting, pruning, a status write ignored)."""

    method: str
    path: str
    body: Body = None
    content_type: str = "application/json"
    params: Mapping[str, str] = field(default_factory=dict)
    save: str | None = None
    project: Callable[[Any], Any] | None = None
    token: str | None = None  # a context key holding a bearer token (the real server: that identity)


@dataclass(frozen=True)
class Row:
    """One row of the table: its steps run in order on each server; every step's answer is compared."""

    id: str
    why: str  # what the operator relies on, or what the double claims
    steps: tuple[Req, ...]


class Target:
    """One server: the real kube-apiserver (``ssl`` with the admin's client certificate) or the double."""

    def __init__(
        self, name: str, base: str, context: ssl.SSLContext | None = None, ca_file: str | None = None
    ) -> None:
        self.name, self.base, self.ssl, self.ca_file = name, base.rstrip("/"), context, ca_file
        self.ctx: dict[str, Any] = {}

    def send(self, req: Req) -> Answer:
        body = req.body(self.ctx) if callable(req.body) else req.body
        query = "&".join(f"{k}={v}" for k, v in req.params.items())
        url = self.base + req.path + (f"?{query}" if query else "")
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = req.content_type
        if req.token:
            headers["Authorization"] = f"Bearer {self.ctx[req.token]}"
        request = urllib.request.Request(url, data=data, method=req.method, headers=headers)
        context = self.ssl
        if req.token and self.ssl is not None:  # a token, not the admin's certificate
            context = ssl.create_default_context(cafile=self.ca_file)
        try:
            with urllib.request.urlopen(request, timeout=30, context=context) as resp:
                code, text = resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            code, text = exc.code, exc.read().decode()
        try:
            answer = json.loads(text.splitlines()[0]) if text.strip() else None
        except ValueError:
            answer = text
        reason = ""
        if isinstance(answer, dict) and answer.get("kind") == "Status" and answer.get("status") == "Failure":
            reason = str(answer.get("reason") or "")
        elif code >= 400:
            reason = "<no Status>"
        if req.save and code < 400:
            self.ctx[req.save] = answer
        projected = req.project(answer) if req.project and code < 400 else None
        return Answer(code, reason, projected, answer)


def served_double(crd_path: Path) -> Iterator[tuple[ApiServerEmulator, str]]:
    """The double (:func:`emulated_api_server`, the operator tests' set-up) served from a thread."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        async with emulated_api_server(crd_path) as served:
            box["served"] = served
            box["stop"] = asyncio.Event()
            ready.set()
            await box["stop"].wait()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    if not ready.wait(60):
        raise RuntimeError("the API-server double did not start")
    try:
        yield box["served"]
    finally:
        loop.call_soon_threadsafe(box["stop"].set)
        thread.join(30)
