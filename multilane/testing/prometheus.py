"""A real Prometheus for tests and the demo, and metric snapshots. Does I/O (processes, files, HTTP).

- :class:`PrometheusServer` runs the Debian ``prometheus`` binary on 127.0.0.1 with a generated
  config (scrape configs, rule files), answers instant queries through the HTTP API, and is stopped
  by PID. Targets that come and go (local workers) are given through a file_sd file written with
  :func:`write_file_sd`; Prometheus re-reads it on change.

Metric snapshots (one scrape written to a file, no Prometheus needed) live in
:mod:`multilane.testing.metrics_snapshot`; they are re-exported here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import requests
import yaml

from multilane.testing.broker import free_port
from multilane.testing.metrics_snapshot import scrape_endpoints, write_metrics_snapshot

__all__ = [
    "PrometheusError",
    "PrometheusServer",
    "scrape_endpoints",
    "write_file_sd",
    "write_metrics_snapshot",
]


class PrometheusError(RuntimeError):
    """Prometheus did not start, or refused a query."""


def write_file_sd(path: str | os.PathLike[str], targets: Mapping[str, Mapping[str, str]]) -> None:
    """Write a Prometheus file_sd file atomically: ``targets`` maps ``host:port`` to its labels."""
    path = Path(path)
    groups = [{"targets": [t], "labels": dict(labels)} for t, labels in sorted(targets.items())]
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(groups, indent=1), encoding="utf-8")
    os.replace(tmp, path)


class PrometheusServer:
    """One Prometheus process. ``scrape_configs``: Prometheus ``scrape_configs`` entries;
    ``rule_files``: rule files to load (evaluated every ``evaluation_interval``)."""

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        scrape_configs: Sequence[Mapping[str, Any]],
        rule_files: Iterable[str | os.PathLike[str]] = (),
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        binary: str = "prometheus",
    ) -> None:
        self.workdir = Path(workdir)
        self.scrape_configs = [dict(c) for c in scrape_configs]
        self.rule_files = [str(p) for p in rule_files]
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval
        self.binary = binary
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "prometheus.log"

    def start(self, timeout_s: float = 30.0) -> str:
        """Write the config, start the process, wait until ``/-/ready``; returns the base URL."""
        if shutil.which(self.binary) is None:
            raise PrometheusError(f"{self.binary!r} is not installed (Debian package 'prometheus')")
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "evaluation_interval": self.evaluation_interval,
            },
            "rule_files": self.rule_files,
            "scrape_configs": self.scrape_configs,
        }
        config_path = self.workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        self.port = free_port()
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={config_path}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    "--web.enable-lifecycle",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            try:
                if requests.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return self.url
            except requests.RequestException:
                pass
            time.sleep(0.1)
        tail = self.log_path.read_text(errors="replace")[-2000:]
        self.stop()
        raise PrometheusError(f"prometheus did not become ready: {tail}")

    def stop(self) -> None:
        """SIGTERM by PID, SIGKILL after 20 s."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> PrometheusServer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _api(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        answer = requests.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        body = answer.json()
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query; the result vector (``[{"metric": {...}, "value": [t, "v"]}, ...]``)."""
        data = self._api("query", {"query": expr})
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def targets(self) -> list[dict[str, Any]]:
        """Active scrape targets with their health."""
        active: list[dict[str, Any]] = self._api("targets")["activeTargets"]
        return active

    def rules(self) -> list[dict[str, Any]]:
        """Loaded rule groups with each rule's health and state."""
        groups: list[dict[str, Any]] = self._api("rules")["groups"]
        return groups

    def wait_for(self, expr: str, timeout_s: float = 30.0, interval_s: float = 0.5) -> list[dict[str, Any]]:
        """Query until ``expr`` returns series; raises AssertionError naming the query otherwise."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(expr)
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"no series for {expr!r} within {timeout_s:.0f}s")
            time.sleep(interval_s)
