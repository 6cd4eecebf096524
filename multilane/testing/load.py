"""``LoadgenProcess``: ``multilane loadgen`` with a rate profile in its own process, for the demo and
the benchmarks. Does I/O (a subprocess, files)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from multilane.testing.loadgen import LoadResult, read_produced

__all__ = ["LoadgenProcess"]


class LoadgenProcess:
    """``multilane loadgen`` with a rate profile, in its own process, so that it holds its rate on a
    busy machine (a generator thread beside a control plane and a display competes with them for
    the interpreter and falls behind). Does I/O (a subprocess, files in ``out_dir``).

    :meth:`finish` waits for it (or stops it with SIGTERM: it flushes and writes what was
    delivered), then returns the exact produced set and the offered/delivered rates per second.

    ``started``: ``time.monotonic()`` when the process was started; after :meth:`finish`, the
    generator's own second 0 (its producer ready, seconds after the process start on a loaded
    machine), so that ``delivered_per_s[i]`` is second ``started + i`` of the caller's clock (Linux:
    one monotonic clock for all processes).
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        profile: str,
        out_dir: str,
        keys: int = 1000,
        zipf_s: float = 0.0,
        seed: int = 1,
        name: str = "loadgen",
    ) -> None:
        import os
        import subprocess

        self.output = os.path.join(out_dir, f"{name}-produced.tsv")
        self.timeline_path = os.path.join(out_dir, f"{name}-timeline.json")
        self.log_path = os.path.join(out_dir, f"{name}.log")
        self.topic = topic
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in finish()
        argv = [
            sys.executable, "-m", "multilane", "loadgen",
            "--bootstrap-servers", bootstrap, "--topic", topic, "--profile", profile,
            "--keys", str(keys), "--zipf-s", str(zipf_s), "--seed", str(seed),
            "--output", self.output, "--timeline", self.timeline_path,
        ]  # fmt: skip
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)

    def running(self) -> bool:
        return self.proc.poll() is None

    def finish(self, timeout_s: float = 120.0, stop: bool = False) -> tuple[LoadResult, dict[str, Any]]:
        """Wait for the end of the profile (``stop``: end it now), then read what it wrote. Raises
        RuntimeError (with the log's tail) when the generator failed."""
        import subprocess

        if stop and self.running():
            self.proc.terminate()
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._log.close()
        try:
            with open(self.timeline_path, encoding="ascii") as f:
                timeline: dict[str, Any] = json.load(f)
            records = read_produced(self.output, self.topic)
        except (OSError, ValueError) as exc:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                tail = f.read()[-2000:]
            raise RuntimeError(f"load generator failed (exit {code}): {exc}; log: {tail}") from exc
        summary = timeline.get("summary") or {}
        result = LoadResult(
            self.topic,
            records=records,
            failed=int(summary.get("failed", 0)),
            elapsed_s=float(summary.get("elapsed_s", 0.0)),
            sampler=str(summary.get("sampler", "none")),
            skipped=int(timeline.get("skipped", 0)),
            delivered_per_s=[int(x) for x in timeline.get("delivered_per_s", [])],
            offered_per_s=[float(x) for x in timeline.get("offered_per_s", [])],
            latency_max_per_s=[float(x) for x in timeline.get("latency_max_per_s", [])],
            started_monotonic=float(timeline.get("started_monotonic") or 0.0),
            ready_s=float(summary.get("ready_s", 0.0)),
        )
        if result.started_monotonic > 0:
            self.started = result.started_monotonic
        return result, timeline
