"""What a worker engine shows: its status (``/v1/status``), the learners' status, and the accessors the
Prometheus collectors read (:mod:`multilane.worker.metrics`). Reads engine state only; the learner
status is read on its own thread (the state hooks may hold their lock during network calls)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from multilane.worker.metrics import LatencyHistogram
from multilane.worker.ownership import PartitionOwnership
from multilane.worker.partition import PartitionRuntime, Phase

__all__ = ["EngineViews"]

log = logging.getLogger("multilane.worker.engine")


class EngineViews(PartitionOwnership):
    """Status and metric-source accessors of the engine."""

    @property
    def commit_latency(self) -> LatencyHistogram | None:
        """Start of a commit cycle -> the broker's acknowledgement (None before the start)."""
        return self._commits.latency if self._commits is not None else None

    @property
    def factor(self) -> int:
        return self._factor

    def status(self) -> dict[str, Any]:
        """The worker's status (``GET /v1/status``; docs/architecture.md, "Worker control API").

        ``partitions``: the partitions this engine owns, plus those whose state is being opened
        (phase ``promoting``: a restore or a learner's promotion before processing starts); their
        ``restore_lag`` comes from the state hooks' ``learner_status()``. ``learners``: every
        partition the state hooks know (restoring, learning, promoting, active, failed) with its
        restore progress; learners of partitions this engine does not own appear only there (the
        operator counts every ``partitions`` entry as owned). The learner figures are those of the
        last :meth:`refresh_learners` (the housekeeping loop refreshes them every half second).
        """
        parts = sorted(self._parts.values(), key=lambda p: (p.topic, p.partition))
        learners = self._learners
        by_tp = {(str(e.get("topic")), int(e.get("partition", -1))): e for e in learners}
        entries = []
        for p in parts:
            entry = p.status()
            learner = by_tp.get((p.topic, p.partition))
            if learner is not None:
                entry["restore_lag"] = int(learner.get("restore_lag") or 0)
            entries.append(entry)
        for tp in sorted(self._opening):
            learner = by_tp.get(tp, {})
            entries.append(
                {
                    "topic": tp[0],
                    "partition": tp[1],
                    "phase": Phase.PROMOTING,
                    "committed": learner.get("committed_offset"),
                    "position": None,
                    "high_watermark": None,
                    "lag": None,
                    "in_flight": 0,
                    "restore_lag": int(learner.get("restore_lag") or 0),
                    "state_phase": learner.get("phase"),
                }
            )
        out: dict[str, Any] = {
            "worker_id": self.config.worker_id,
            "generation": self.generation,
            "factor": self._factor,
            "mode": self.config.ordering.value,
            "paused": self.user_paused,
            "fenced": self._fenced_at is not None,
            "partitions": entries,
            "processed_total": self.processed_total(),
            "processing_rate": round(self.processing_rate, 3),
            "busy_lanes": round(self.busy_lanes, 3),
            "in_flight": self._flow.records,
            "in_flight_bytes": self._flow.bytes,
            "peak_in_flight": self._flow.peak_records,
            "peak_in_flight_bytes": self._flow.peak_bytes,
            "max_in_flight": self._flow.max_records,
            "max_in_flight_bytes": self._flow.max_bytes,
            "stalled": self._watchdog.stalled,
            "back_pressure_pauses": sum(p.flow_counters.pauses for p in parts),
        }
        if self.hooks is not None:
            out["learners"] = learners
        return out

    async def refresh_learners(self) -> None:
        """Re-read the state hooks' ``learner_status()`` on an I/O thread (for :meth:`status`)."""
        if self.hooks is not None and not self._stopping:
            self._learners = await asyncio.get_running_loop().run_in_executor(
                self._status_pool, self._learner_status
            )

    def _learner_status(self) -> list[dict[str, Any]]:
        """The state hooks' ``learner_status()`` ([] without hooks or when it fails; blocking)."""
        fn = getattr(self.hooks, "learner_status", None) if self.hooks is not None else None
        if fn is None:
            return []
        try:
            return list(fn())
        except Exception:
            log.exception("learner_status() failed")
            return []

    def processed_total(self) -> int:
        return self._released_total + sum(p.processed for p in self._parts.values())

    # -- metrics source --------------------------------------------------------------------------------

    def metric_partitions(self) -> list[PartitionRuntime]:
        return list(self._parts.values())

    @property
    def histogram(self) -> LatencyHistogram:
        return self._hist

    def stalled_count(self) -> int:
        return self._watchdog.stalled

    def lane_utilisation(self) -> float:
        parts = list(self._parts.values())
        if not parts:
            return 0.0
        return sum(p.lanes.busy_fraction for p in parts) / len(parts)

    def last_progress_bytes(self) -> int:
        return self._commits.last_progress_bytes if self._commits is not None else 0
