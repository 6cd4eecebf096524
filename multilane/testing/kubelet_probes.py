"""A container's probes as the kubelet runs them (readiness, liveness, startup): ``httpGet``,
``tcpSocket`` and ``exec``, with the probe's timing and thresholds. Does I/O (connections,
processes).

:class:`ProbeState` keeps one probe's schedule and result: the first run after
``initialDelaySeconds``, then every ``periodSeconds``; the result flips to success after
``successThreshold`` consecutive successes and to failure after ``failureThreshold`` consecutive
failures. A ``grpc`` probe is not supported: it always fails, with that said in ``last_error``.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

__all__ = ["ProbeState", "run_probe"]


async def run_probe(
    probe: dict[str, Any],
    pod_ip: str,
    named_ports: dict[str, int],
    exec_prefix: Sequence[str],
    env: dict[str, str],
) -> tuple[bool, str]:
    """One attempt of ``probe``: (success, why it failed). ``exec_prefix`` enters the container's
    mount namespace (``nsenter``) before an ``exec`` probe's command."""
    timeout = float(probe.get("timeoutSeconds", 1))

    def port_of(value: Any) -> int:
        return named_ports[value] if isinstance(value, str) and not value.isdigit() else int(value)

    try:
        if "httpGet" in probe:
            get = probe["httpGet"]
            scheme = str(get.get("scheme", "HTTP")).lower()
            url = f"{scheme}://{get.get('host') or pod_ip}:{port_of(get['port'])}{get.get('path', '/')}"
            headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
            ctx: ssl.SSLContext | bool = False
            if scheme == "https":  # the kubelet does not verify a probe's certificate
                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
                session.get(url, headers=headers, ssl=ctx, allow_redirects=False) as resp,
            ):
                if 200 <= resp.status < 400:
                    return True, ""
                return False, f"HTTP probe failed with statuscode: {resp.status}"
        if "tcpSocket" in probe:
            sock = probe["tcpSocket"]
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(sock.get("host") or pod_ip, port_of(sock["port"])), timeout
            )
            writer.close()
            return True, ""
        if "exec" in probe:
            proc = await asyncio.create_subprocess_exec(
                *exec_prefix,
                *probe["exec"]["command"],
                env=env,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            try:
                code = await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                return False, f"command timed out after {timeout:g}s"
            return code == 0, "" if code == 0 else f"command exited with {code}"
        return False, "unsupported probe (only httpGet, tcpSocket and exec)"
    except (OSError, TimeoutError, aiohttp.ClientError, KeyError, ValueError) as exc:
        return False, f"{type(exc).__name__}: {exc}"


@dataclass
class ProbeState:
    """One probe of one container incarnation (see the module docstring).

    Invariant: ``ok`` changes only after the threshold's count of equal results in a row.
    """

    probe: dict[str, Any]
    started: float  # monotonic time the container started
    ok: bool = False
    successes: int = 0
    failures: int = 0
    next_at: float = 0.0
    last_error: str = ""
    running: bool = False

    def __post_init__(self) -> None:
        self.next_at = self.started + float(self.probe.get("initialDelaySeconds", 0))

    def due(self, now: float) -> bool:
        return not self.running and now >= self.next_at

    def record(self, now: float, success: bool, error: str) -> None:
        self.next_at = now + float(self.probe.get("periodSeconds", 10))
        self.last_error = error
        if success:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= int(self.probe.get("successThreshold", 1)):
                self.ok = True
        else:
            self.successes, self.failures = 0, self.failures + 1
            if self.failures >= int(self.probe.get("failureThreshold", 3)):
                self.ok = False

    @property
    def failed(self) -> bool:
        """Failed ``failureThreshold`` times in a row (liveness and startup: restart the container)."""
        return self.failures >= int(self.probe.get("failureThreshold", 3))
