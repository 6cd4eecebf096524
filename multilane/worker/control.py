"""The worker's authenticated HTTP control endpoint (aiohttp, on the engine's loop). Does I/O.

Routes and bodies are fixed in docs/architecture.md ("Worker control API"). Every request except
``GET /healthz`` (liveness: the process answers) and ``GET /readyz`` (readiness: the engine's facts
from :func:`engine_facts`, the supervisor's laid over them, decided by ``multilane.worker.readiness``) needs
``Authorization: Bearer <token>`` (compared with ``hmac.compare_digest``);
without it the answer is 401. Bad JSON or fields -> 400 with a message; a stale assignment generation
-> 409. Learner routes (``/v1/learn``, ``/v1/promote``, ``/v1/demote``, ``/v1/drop``) go through the
engine's learner calls (:meth:`Engine.learn` etc.) when the worker has state hooks (else 404); a
partition in the wrong phase for the call (the hooks' ``StatePhaseError``, e.g. ``/v1/promote`` of a
learner that has not caught up) -> 409, other state errors -> 500, both with a message.

With an ``ssl_context`` (``multilane worker --control-tls-*``, :mod:`multilane.worker.control_tls`)
the port speaks only TLS and requires a client certificate, on top of the token.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from confluent_kafka import KafkaException

from multilane.formats.handover import Handover, HandoverError, decode_handovers
from multilane.worker.engine import Engine, EngineError, FencingError
from multilane.worker.readiness import ReadinessFacts, readiness
from multilane.worker.state.errors import StateError, StatePhaseError

__all__ = ["ControlServer", "TokenError", "engine_facts", "load_token"]

log = logging.getLogger(__name__)

TOKEN_ENV = "MULTILANE_CONTROL_TOKEN"
# Probes (the kubelet sends no token): liveness and readiness answer without one.
UNAUTHENTICATED = frozenset({"/healthz", "/readyz"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class TokenError(ValueError):
    """No usable control token was configured."""


def load_token(token_file: str | None) -> str:
    """The control token: from ``token_file`` if given, else ``$MULTILANE_CONTROL_TOKEN``."""
    if token_file:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise TokenError(f"cannot read control token file {token_file!r}: {exc}") from exc
        if not token:
            raise TokenError(f"control token file {token_file!r} is empty")
        return token
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise TokenError(f"the control port needs a token: --control-token-file or ${TOKEN_ENV}")
    return token


def engine_facts(engine: Engine) -> ReadinessFacts:
    """The engine's readiness facts (the pod's readiness probe, ``GET /readyz``): started (its initial
    assignment taken, its loops running), fenced, and its partitions active or still being restored
    (phase ``promoting``: state being opened). Read through the engine's status accessors only."""
    started = engine.ready.is_set()
    return ReadinessFacts.of_engine(started, engine.status() if started else {})


class _BadRequestError(Exception):
    pass


def _partitions(body: dict[str, Any], field: str = "partitions") -> list[tuple[str, int]]:
    raw = body.get(field)
    if not isinstance(raw, list):
        raise _BadRequestError(f"'{field}' must be a list of {{topic, partition}} objects")
    out = []
    for item in raw:
        if not isinstance(item, dict):
            raise _BadRequestError(f"each of '{field}' must be an object, got {item!r}")
        topic, part = item.get("topic"), item.get("partition")
        if not isinstance(topic, str) or not topic or not isinstance(part, int) \
                or isinstance(part, bool) or part < 0:
            raise _BadRequestError(f"bad partition {item!r}: needs topic (str) and partition (int >= 0)")
        out.append((topic, part))
    return out


def _handovers(body: dict[str, Any]) -> dict[tuple[str, int], Handover]:
    """The optional ``progress`` of an assignment (:func:`~multilane.formats.handover.decode_handovers`):
    what the partitions' last owners released (the progress record, base64, and the changelog end)."""
    try:
        return decode_handovers(body.get("progress", []))
    except HandoverError as exc:
        raise _BadRequestError(str(exc)) from None


def _progress_hints(body: dict[str, Any]) -> dict[tuple[str, int], bytes]:
    """The progress records of :func:`_handovers`, as bytes."""
    return {tp: h.record() for tp, h in _handovers(body).items()}


def _changelog_ends(body: dict[str, Any]) -> dict[tuple[str, int], int]:
    """The changelog ends of :func:`_handovers` (where each partition's changelog ended when its last
    owner released it)."""
    return {tp: h.changelog_end for tp, h in _handovers(body).items() if h.changelog_end is not None}


def _number(body: dict[str, Any], field: str, default: float) -> float:
    v = body.get(field, default)
    if not isinstance(v, int | float) or isinstance(v, bool) or v < 0:
        raise _BadRequestError(f"'{field}' must be a number >= 0")
    return float(v)


class ControlServer:
    """Serves the control API of one engine. Invariant: ``_token`` is non-empty."""

    def __init__(
        self,
        engine: Engine,
        token: str,
        host: str = "127.0.0.1",
        port: int = 8471,
        ssl_context: ssl.SSLContext | None = None,
        supervisor: Any = None,
    ) -> None:
        if not token:
            raise TokenError("empty control token")
        self.engine = engine
        # ``multilane.worker.supervision.WorkerSupervisor`` (readiness, circuit breaker), or None
        self.supervisor = supervisor
        self._token = token.encode()
        self.host = host
        self.port = port
        # TLS (multilane/worker/control_tls.py): with it the port speaks only TLS, client certificates
        # required; None: plain HTTP (loopback, the local control plane)
        self.ssl_context = ssl_context
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth_middleware, self._error_middleware])
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_post("/breaker/reset", self._breaker_reset)
        app.router.add_get("/v1/status", self._status)
        app.router.add_post("/v1/assignment", self._assignment)
        app.router.add_post("/v1/factor", self._factor)
        app.router.add_post("/v1/pause", self._pause)
        app.router.add_post("/v1/resume", self._resume)
        app.router.add_post("/v1/release", self._release)
        for verb in ("learn", "promote", "demote", "drop"):
            app.router.add_post(f"/v1/{verb}", self._learner(verb))
        return app

    def probes(self) -> dict[str, Handler]:
        """``/healthz`` and ``/readyz``, also served on the metrics port (plain HTTP): with TLS on this
        port, the kubelet's probes (no client certificate) go there."""
        return {"/healthz": self._healthz, "/readyz": self._readyz}

    async def start(self) -> int:
        """Bind and serve; returns the bound port (useful with port 0)."""
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=self.ssl_context)
        await site.start()
        sockets = getattr(site._server, "sockets", None)
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        log.info("control endpoint on %s:%d", self.host, self.port)
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- middlewares -----------------------------------------------------------------------------------

    @web.middleware
    async def _auth_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in UNAUTHENTICATED:
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, supplied = header.partition(" ")
        ok = scheme.lower() == "bearer" and hmac.compare_digest(supplied.strip().encode(), self._token)
        if not ok:
            return web.json_response({"error": "unauthorized"}, status=401,
                                     headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    @web.middleware
    async def _error_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except _BadRequestError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        except FencingError as exc:
            return web.json_response({"error": str(exc), "generation": self.engine.generation},
                                     status=409)
        except EngineError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        except StatePhaseError as exc:
            return web.json_response({"error": str(exc)}, status=409)
        except StateError as exc:
            log.error("control request %s failed: %s", request.path, exc)
            return web.json_response({"error": f"state: {exc}"}, status=500)
        except KafkaException as exc:  # e.g. the broker is unreachable: the caller should retry
            log.warning("control request %s failed: %s", request.path, exc)
            return web.json_response({"error": f"kafka: {exc}"}, status=503)

    async def _body(self, request: web.Request) -> dict[str, Any]:
        if not request.can_read_body:
            return {}
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise _BadRequestError(f"body is not valid JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise _BadRequestError("body must be a JSON object")
        return body

    # -- handlers ------------------------------------------------------------------------------------

    async def _healthz(self, request: web.Request) -> web.Response:
        """Liveness: the event loop answers."""
        return web.json_response({"ok": True})

    async def _readyz(self, request: web.Request) -> web.Response:
        """Readiness: 200 when ready, else 503 with every reason. The engine's facts
        (:func:`engine_facts`: started, not fenced, nothing being restored) and, with a supervisor, the
        worker's laid over them (broker reachable, topics present, breaker closed); one decision
        (``multilane.worker.readiness``)."""
        facts = engine_facts(self.engine)
        if self.supervisor is not None:
            facts = self.supervisor.facts(facts)
        r = readiness(facts)
        return web.json_response(r.to_dict(), status=200 if r.ready else 503)

    async def _breaker_reset(self, request: web.Request) -> web.Response:
        """Close the circuit breaker: held records run again."""
        if self.supervisor is None:
            return web.json_response({"error": "this worker has no circuit breaker"}, status=404)
        was_open = self.supervisor.breaker.reset()
        return web.json_response({"was_open": was_open, **self.supervisor.breaker.status()})

    async def _status(self, request: web.Request) -> web.Response:
        """The engine's status (with state hooks: ``learners`` too) and, with a supervisor, its
        circuit breaker (``breaker``: ``open``, ``reason``, ...), which the operator reports as the
        ParallelConsumer's condition Degraded (reason ``CircuitBreakerOpen``)."""
        await self.engine.refresh_learners()  # learner figures read off the loop, fresh
        status = self.engine.status()
        if self.supervisor is not None:
            status["breaker"] = self.supervisor.breaker.status()
        return web.json_response(status)

    async def _assignment(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        generation = body.get("generation")
        if not isinstance(generation, int) or isinstance(generation, bool):
            raise _BadRequestError("'generation' must be an int")
        parts = _partitions(body)
        deadline = _number(body, "release_deadline_s", 30.0)
        handovers = _handovers(body)
        hints = {tp: h.record() for tp, h in handovers.items()}
        ends = {tp: h.changelog_end for tp, h in handovers.items() if h.changelog_end is not None}
        released = await self.engine.assign(parts, generation, deadline, hints, ends)
        return web.json_response({"generation": self.engine.generation,
                                  "released": [r.to_dict() for r in released]})

    async def _factor(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        f = body.get("factor")
        if not isinstance(f, int) or isinstance(f, bool):
            raise _BadRequestError("'factor' must be an int")
        return web.json_response({"factor": await self.engine.set_factor(f)})

    async def _pause(self, request: web.Request) -> web.Response:
        self.engine.pause()
        return web.json_response({"paused": True})

    async def _resume(self, request: web.Request) -> web.Response:
        self.engine.resume()
        return web.json_response({"paused": False})

    async def _release(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        parts = _partitions(body)
        deadline = _number(body, "deadline_s", 30.0)
        released = await self.engine.release(parts, deadline)
        return web.json_response({"released": [r.to_dict() for r in released]})

    def _learner(self, verb: str) -> Handler:
        """``/v1/<verb>``: ``{"partitions": [...]}`` -> ``{verb: [...]}``; ``/v1/demote`` also answers
        ``released`` (the partitions it released first, with their final committed offsets;
        ``deadline_s`` bounds their drain as for ``/v1/release``)."""

        async def handle(request: web.Request) -> web.StreamResponse:
            if self.engine.learner is None:
                return web.json_response({"error": f"/v1/{verb} needs a worker with a state store"},
                                         status=404)
            body = await self._body(request)
            parts = _partitions(body)
            answer: dict[str, Any] = {verb: [{"topic": t, "partition": p} for t, p in parts]}
            if verb == "learn":
                await self.engine.learn(parts)
            elif verb == "promote":
                await self.engine.promote(parts)
            elif verb == "drop":
                await self.engine.drop(parts)
            else:
                released = await self.engine.demote(parts, _number(body, "deadline_s", 30.0))
                answer["released"] = [r.to_dict() for r in released]
            return web.json_response(answer)

        return handle
