"""Running the snapshot job locally for a ParallelConsumer (the local control plane). Does I/O.

:func:`run_local_snapshot` runs the same ``multilane snapshot`` command the CronJob runs
(:func:`multilane.pipeline.k8s.snapshot_command`) in a child process with this interpreter, and
returns its JSON summary.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from multilane.pipeline.k8s import snapshot_command

__all__ = ["LocalSnapshotRun", "run_local_snapshot"]


@dataclass
class LocalSnapshotRun:
    """Outcome of one local run. Invariant: ``summary`` is set exactly when ``returncode == 0``."""

    returncode: int
    summary: dict[str, Any] | None
    argv: list[str]
    stderr_tail: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.summary is not None

    @property
    def snapshot_id(self) -> str | None:
        return None if self.summary is None else self.summary.get("snapshot_id")


def run_local_snapshot(
    pc: Mapping[str, Any],
    *,
    bootstrap_servers: str | None = None,
    uri: str | None = None,
    factor: int | None = None,
    master: str = "local[2]",
    extra_args: list[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 1800.0,
) -> LocalSnapshotRun:
    """Run one snapshot of ``pc`` in a child process and wait for it (at most ``timeout_s``).

    ``bootstrap_servers`` and ``uri`` override the spec (the local control plane runs its own broker
    and keeps snapshots in a local folder). The child is killed on timeout (nothing becomes visible:
    the publish protocol makes a killed job harmless).
    """
    spec = dict(pc.get("spec") or {})
    kafka = dict(spec.get("kafka") or {})
    state = dict(spec.get("state") or {})
    snapshot = dict(state.get("snapshot") or {})
    if bootstrap_servers:
        kafka["bootstrapServers"] = bootstrap_servers
    if uri:
        snapshot["uri"] = uri
    state["snapshot"] = snapshot
    spec.update(kafka=kafka, state=state)
    argv = snapshot_command({**pc, "spec": spec}, factor=factor, master=master)
    cmd = [sys.executable, "-m", "multilane", *argv[1:], *(extra_args or [])]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **dict(env or {})},
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return LocalSnapshotRun(-9, None, cmd, [*(err or "").splitlines()[-20:], "timed out"])
    summary: dict[str, Any] | None = None
    lines = [line for line in out.splitlines() if line.strip()]
    if proc.returncode == 0 and lines:
        try:
            parsed = json.loads(lines[-1])
            summary = parsed if isinstance(parsed, dict) else None
        except json.JSONDecodeError:
            summary = None
    return LocalSnapshotRun(
        proc.returncode if summary is not None or proc.returncode else 1,
        summary,
        cmd,
        (err or "").splitlines()[-20:],
    )
